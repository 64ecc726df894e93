//! A small W3C WebDriver client over plain HTTP to Debian's `chromedriver`, driving
//! Debian's headless `chromium` (both installed by `cargo xtask setup`): enough for
//! the dashboard's browser tests (open a page, type, click, run a script, read the
//! console, take a screenshot). A client crate would bring a second HTTP stack for
//! ten calls; `sluice_loadgen::Client` already speaks HTTP/1.1.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sluice_loadgen::Client;

/// The W3C key under which an element reference comes back.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where a program is: `$var` when set, else the first of `candidates` that exists.
fn program(var: &str, candidates: &[&str]) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Ok(PathBuf::from(p));
    }
    candidates.iter().map(PathBuf::from).find(|p| p.exists()).with_context(|| {
        format!("none of {candidates:?} exists (set {var}): run `cargo xtask setup`, which installs Debian's chromium and chromium-driver")
    })
}

/// One chromedriver process and one browser session in it.
pub struct Browser {
    driver: Child,
    client: Client,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium session
    /// with the flags this machine needs (no sandbox as root, no GPU, no background
    /// network: the machine's closed network refuses those connections), a fresh
    /// profile, and the browser's console log kept for [`Browser::console`].
    pub async fn start() -> Result<Browser> {
        let chromedriver = program("SLUICE_CHROMEDRIVER", &["/usr/bin/chromedriver"])?;
        let chromium = program("SLUICE_CHROMIUM", &["/usr/bin/chromium", "/usr/bin/chromium-browser"])?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start {}", chromedriver.display()))?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let profile = tempfile::tempdir()?;
        // Until chromedriver listens (its own start takes tens of milliseconds).
        let end = Instant::now() + Duration::from_secs(20);
        let mut client = loop {
            match Client::connect(addr).await {
                Ok(c) => break c,
                Err(e) if Instant::now() > end => return Err(e).context("chromedriver never listened"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,1800",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--user-data-dir={}", profile.path().display())])
        .collect::<Vec<_>>();
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": args },
            "goog:loggingPrefs": { "browser": "ALL" },
        }}});
        let r = client
            .request("POST", "/session", &[("content-type", "application/json")], caps.to_string().as_bytes())
            .await?;
        if r.status != 200 {
            bail!("chromedriver refused the session: {} {}", r.status, r.text());
        }
        let session = r.json()["value"]["sessionId"].as_str().context("no sessionId")?.to_string();
        Ok(Browser { driver, client, session, _profile: profile })
    }

    /// One WebDriver command; its `value`, or the error it answered.
    pub async fn cmd(&mut self, method: &str, path: &str, body: Value) -> Result<Value> {
        let path = format!("/session/{}{path}", self.session);
        let body = if method == "GET" { String::new() } else { body.to_string() };
        let r = self.client.request(method, &path, &[("content-type", "application/json")], body.as_bytes()).await?;
        if r.status != 200 {
            bail!("webdriver {method} {path}: {} {}", r.status, r.text());
        }
        Ok(r.json()["value"].clone())
    }

    /// Opens `url`.
    pub async fn goto(&mut self, url: &str) -> Result<()> {
        self.cmd("POST", "/url", json!({ "url": url })).await.map(|_| ())
    }

    /// Runs `script` (a function body) in the page; what it returns.
    pub async fn exec(&mut self, script: &str) -> Result<Value> {
        self.cmd("POST", "/execute/sync", json!({ "script": script, "args": [] })).await
    }

    /// The element `css` selects.
    pub async fn find(&mut self, css: &str) -> Result<String> {
        let v = self.cmd("POST", "/element", json!({ "using": "css selector", "value": css })).await?;
        v[ELEMENT].as_str().map(str::to_string).with_context(|| format!("no element {css}"))
    }

    /// Types `text` into the element `css` selects, as a user would.
    pub async fn type_into(&mut self, css: &str, text: &str) -> Result<()> {
        let id = self.find(css).await?;
        self.cmd("POST", &format!("/element/{id}/value"), json!({ "text": text })).await.map(|_| ())
    }

    /// Clicks the element `css` selects.
    pub async fn click(&mut self, css: &str) -> Result<()> {
        let id = self.find(css).await?;
        self.cmd("POST", &format!("/element/{id}/click"), json!({})).await.map(|_| ())
    }

    /// The browser console's entries since the last call (chromedriver's log).
    pub async fn console(&mut self) -> Result<Vec<Value>> {
        let v = self.cmd("POST", "/se/log", json!({ "type": "browser" })).await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// The text of an open alert dialog, if one is open.
    pub async fn alert(&mut self) -> Result<Option<String>> {
        let path = format!("/session/{}/alert/text", self.session);
        let r = self.client.request("GET", &path, &[], b"").await?;
        match r.status {
            200 => Ok(Some(r.json()["value"].as_str().unwrap_or_default().to_string())),
            404 if r.json()["value"]["error"] == "no such alert" => Ok(None),
            s => bail!("webdriver alert: {s} {}", r.text()),
        }
    }

    /// Saves a screenshot of the window as a PNG at `path`.
    pub async fn screenshot(&mut self, path: &Path) -> Result<()> {
        use base64::Engine as _;
        let v = self.cmd("GET", "/screenshot", Value::Null).await?;
        let png =
            base64::engine::general_purpose::STANDARD.decode(v.as_str().context("screenshot is not a string")?)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| format!("write {}", path.display()))
    }

    /// Polls `script` every 50 ms until it returns `true` or `timeout` passes; false then.
    pub async fn until(&mut self, timeout: Duration, script: &str) -> Result<bool> {
        let end = Instant::now() + timeout;
        loop {
            if self.exec(script).await? == Value::Bool(true) {
                return Ok(true);
            }
            if Instant::now() > end {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Browser {
    /// Ends the session (chromedriver closes the browser), then the driver.
    pub async fn close(mut self) -> Result<()> {
        let path = format!("/session/{}", self.session);
        self.client.request("DELETE", &path, &[], b"").await?;
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the browser with its driver (chromedriver kills the Chromium it started).
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
