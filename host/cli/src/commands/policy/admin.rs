//! `sluice policy upload` and `sluice policy swap`: the admin API of a running
//! `sluice serve` (`host/server/src/admin.rs`: `POST /admin/policies?name=`,
//! `PUT /admin/apps/{app}/policy`) through `sluice_loadgen::Client`, with the bearer
//! token from `SLUICE_ADMIN_TOKEN` — the variable the server itself reads, so one
//! export serves both — or `--token`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use sluice_loadgen::{Client, HttpResponse};

/// Where the server is and how to authenticate.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// The server's admin address: `http://127.0.0.1:8080`, or `host:port` (its
    /// `admin_listen` when it has one).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// The admin token. Default: the `SLUICE_ADMIN_TOKEN` environment variable
    /// (prefer it: a command line is visible to other users of the machine).
    #[arg(long)]
    pub token: Option<String>,
}

/// `sluice policy upload`.
#[derive(Debug, Args)]
pub struct UploadArgs {
    /// The component.
    pub file: PathBuf,
    /// The name to upload it under (default: the file's stem).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `sluice policy swap`.
#[derive(Debug, Args)]
pub struct SwapArgs {
    /// The app.
    pub app: String,
    /// The policy (a built-in or an uploaded name).
    pub policy: String,
    /// The policy's params (a JSON object).
    #[arg(long)]
    pub params: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// The address of `server` (`http://host:port`, `host:port`).
pub fn address(server: &str) -> Result<SocketAddr> {
    if server.starts_with("https://") {
        bail!("--server {server}: https is not supported by this client; reach the admin listener over http");
    }
    let rest = server.strip_prefix("http://").unwrap_or(server).trim_end_matches('/');
    if rest.contains('/') {
        bail!("--server {server}: give the address only (http://host:port), without a path");
    }
    rest.to_socket_addrs()
        .with_context(|| format!("--server {server}: not an address (http://host:port)"))?
        .next()
        .with_context(|| format!("--server {server}: resolves to no address"))
}

fn token(args: &ServerArgs) -> Result<String> {
    args.token.clone().or_else(|| std::env::var("SLUICE_ADMIN_TOKEN").ok()).filter(|t| !t.is_empty()).context(
        "no admin token: set SLUICE_ADMIN_TOKEN (the token the server was started with: its `admin_token` or its \
         own SLUICE_ADMIN_TOKEN) or pass --token",
    )
}

/// Sends one admin request; the response, or an error naming the status and the server's message.
fn send(args: &ServerArgs, method: &str, path: &str, body: (&str, &[u8]), what: &str) -> Result<Value> {
    let (content_type, body) = body;
    let addr = address(&args.server)?;
    let token = token(args)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let r: HttpResponse = rt
        .block_on(async {
            let mut client = Client::connect(addr).await?;
            let auth = format!("Bearer {token}");
            client
                .request(method, path, &[("authorization", auth.as_str()), ("content-type", content_type)], body)
                .await
        })
        .with_context(|| format!("{what}: {method} http://{addr}{path}"))?;
    let json = r.json();
    if !(200..300).contains(&r.status) {
        let message =
            json["error"].as_str().map(String::from).unwrap_or_else(|| String::from_utf8_lossy(&r.body).into());
        let hint = match r.status {
            401 => " (check SLUICE_ADMIN_TOKEN)",
            403 => " (the server's admin API is off: start it with admin_token or SLUICE_ADMIN_TOKEN)",
            404 if path.starts_with("/admin") && message.contains("admin listener") => {
                " (use the server's admin_listen address)"
            }
            _ => "",
        };
        bail!("{what} refused: HTTP {}: {message}{hint}", r.status);
    }
    Ok(json)
}

/// A policy name as the admin API takes it in `?name=` (no escaping needed for these).
fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.') {
        bail!("policy name `{name}`: use letters, digits, `-`, `_` and `.`");
    }
    Ok(())
}

/// Runs `sluice policy upload`.
pub fn upload(args: UploadArgs) -> Result<()> {
    let bytes = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let name = match &args.name {
        Some(n) => n.clone(),
        None => args.file.file_stem().and_then(|s| s.to_str()).map(|s| s.replace('_', "-")).context("give --name")?,
    };
    check_name(&name)?;
    let r =
        send(&args.server, "POST", &format!("/admin/policies?name={name}"), ("application/wasm", &bytes), "upload")?;
    println!(
        "uploaded `{}` ({} bytes, sha256 {}, compiled in {:.1} ms)",
        r["name"].as_str().unwrap_or(&name),
        r["size"],
        r["digest"].as_str().map_or("?", |d| &d[..d.len().min(16)]),
        r["compile_ms"].as_f64().unwrap_or(0.0)
    );
    println!("next: sluice policy swap <app> {name}");
    Ok(())
}

/// Runs `sluice policy swap`.
pub fn swap(args: SwapArgs) -> Result<()> {
    check_name(&args.policy)?;
    if args.app.is_empty() || args.app.contains(['/', '?', '#', ' ']) {
        bail!("app name `{}` cannot be part of a URL path", args.app);
    }
    let params = match &args.params {
        None => Value::Object(Default::default()),
        Some(text) => {
            let v: Value = serde_json::from_str(text).context("--params is not JSON")?;
            if !v.is_object() {
                bail!("--params must be a JSON object, got {v}");
            }
            v
        }
    };
    let body = json!({ "policy": args.policy, "params": params }).to_string();
    let r = send(
        &args.server,
        "PUT",
        &format!("/admin/apps/{}/policy", args.app),
        ("application/json", body.as_bytes()),
        "swap",
    )?;
    println!("app `{}` now runs `{}`: {}", args.app, args.policy, r);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(address("http://127.0.0.1:8080").unwrap(), "127.0.0.1:8080".parse().unwrap());
        assert_eq!(address("127.0.0.1:9/").unwrap(), "127.0.0.1:9".parse().unwrap());
        assert!(address("https://x:1").unwrap_err().to_string().contains("https"));
        assert!(address("http://127.0.0.1:1/admin").is_err());
        assert!(address("nonsense").is_err());
        assert!(check_name("my-policy").is_ok());
        assert!(check_name("a&b").is_err());
    }
}
