//! sluice-dashboard: the operator's dashboard as bytes embedded in the binary
//! (`include_bytes!`), so the page works on an air-gapped host and no request
//! leaves it. The live host serves these at `/dashboard` (`sluice_server::dashboard`);
//! `sluice sim report` writes the same script and style beside its HTML report
//! so a simulated and a live run are drawn by the same code.
//!
//! Start here:
//! - [`ASSETS`]: every file, with its content type; [`asset`] finds one by name.
//! - [`CSP`]: the Content-Security-Policy the page is served with (no inline
//!   script, no outside origin).
//! - The page itself: `assets/index.html` (the login form and the panels),
//!   `assets/charts.js` (the charts both the host and the report draw, over uPlot),
//!   `assets/dashboard.js` (polling `/admin/dashboard` and filling the panels),
//!   `assets/report.js` (reading a report's embedded JSON).
//! - uPlot 1.6.32 from npm (`assets/vendor/uplot/`, MIT, its `LICENSE` beside it):
//!   committed as published, so the build needs no network.

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// The name it is served under (`/dashboard/<name>`) and written as.
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub bytes: &'static [u8],
}

/// The dashboard's files. `index.html` is the page; the rest are what it loads.
pub const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("../assets/index.html"),
    },
    Asset {
        name: "dashboard.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../assets/dashboard.css"),
    },
    Asset {
        name: "charts.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../assets/charts.js"),
    },
    Asset {
        name: "dashboard.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../assets/dashboard.js"),
    },
    Asset {
        name: "report.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../assets/report.js"),
    },
    Asset {
        name: "uPlot.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../assets/vendor/uplot/uPlot.iife.min.js"),
    },
    Asset {
        name: "uPlot.min.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../assets/vendor/uplot/uPlot.min.css"),
    },
    Asset {
        name: "uPlot.LICENSE",
        content_type: "text/plain; charset=utf-8",
        bytes: include_bytes!("../assets/vendor/uplot/LICENSE"),
    },
];

/// The Content-Security-Policy of every dashboard response: scripts, styles,
/// data and images from this origin only, no inline script, no `eval`, no
/// frames, no form posted elsewhere. uPlot sizes its elements through the CSSOM
/// (`el.style.x = ...`), which `style-src 'self'` allows; inline `style="..."`
/// attributes and `<style>` blocks would be refused, and the page has none.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                       connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; \
                       frame-ancestors 'none'";

/// The asset called `name`, if there is one.
pub fn asset(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.name == name)
}

/// The bytes of every asset the page loads (the page weight before compression).
pub fn page_bytes() -> usize {
    ASSETS.iter().filter(|a| a.name != "uPlot.LICENSE" && a.name != "report.js").map(|a| a.bytes.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_loads_only_embedded_assets() {
        let html = std::str::from_utf8(asset("index.html").unwrap().bytes).unwrap();
        // Every src/href in the page names an embedded asset: nothing from outside.
        for attr in ["src=\"", "href=\""] {
            for part in html.split(attr).skip(1) {
                let target = part.split('"').next().unwrap();
                if target.starts_with("data:") {
                    continue;
                }
                let name = target.strip_prefix("/dashboard/").unwrap_or(target);
                assert!(asset(name).is_some(), "index.html loads {target}, which is not embedded");
            }
        }
        assert!(!html.contains("<script>") && !html.contains("style=\""), "inline script or style in index.html");
        assert!(page_bytes() < 300 * 1024, "page weight {} bytes", page_bytes());
    }
}
