//! The real Prometheus server and promtool (Debian's `prometheus` package) for the metrics
//! tests, and a plain blocking HTTP GET. Without them the tests say SKIPPED; with
//! `PREFIXSCOPE_REQUIRE_PROMETHEUS` set (CI) they fail instead. Included with `#[path]`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `prometheus` and `promtool` run here.
pub fn have_prometheus(who: &str) -> bool {
    let runs = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let ok = runs("prometheus") && runs("promtool");
    if !ok {
        assert!(
            std::env::var_os("PREFIXSCOPE_REQUIRE_PROMETHEUS").is_none(),
            "PREFIXSCOPE_REQUIRE_PROMETHEUS is set but prometheus or promtool is not installed (apt-get install prometheus)"
        );
        eprintln!(
            "SKIPPED {who}: prometheus and promtool are not installed (apt-get install prometheus)"
        );
    }
    ok
}

/// `promtool check metrics` on `text`: its exit status and what it said.
pub fn promtool_check(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// A free loopback port (bound and let go: the usual small race, fine for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` over HTTP/1.0: the status and the body, or `None` when nothing answers.
pub fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let response = String::from_utf8(response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// Waits until `GET path` answers 200.
pub fn wait_ok(addr: SocketAddr, path: &str, patience: Duration) {
    let start = Instant::now();
    while get(addr, path, None).is_none_or(|(status, _)| status != 200) {
        assert!(
            start.elapsed() < patience,
            "http://{addr}{path} did not answer 200 in {patience:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Prometheus server on a loopback port with its own config and data directory, scraping
/// `targets` every second; killed on drop.
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    pub fn start(dir: &Path, targets: &[SocketAddr]) -> Prometheus {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: prefixscope\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let prometheus = Prometheus {
            child,
            addr,
            dir: dir.to_path_buf(),
        };
        wait_ok(addr, "/-/ready", Duration::from_secs(30));
        prometheus
    }

    /// An instant query through the HTTP API: its `data.result`.
    pub fn query(&self, query: &str) -> serde_json::Value {
        let path = format!("/api/v1/query?query={}", percent_encode(query));
        let (status, body) = get(self.addr, &path, None).expect("prometheus answers");
        assert_eq!(status, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["status"], "success", "{body}");
        json["data"]["result"].clone()
    }

    /// What Prometheus said on stderr, for a failure's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
