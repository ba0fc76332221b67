//! A real terminal for tests: one tmux server per test (its own socket), the screen read back
//! as a person reads it. Shared by the TUI's and the harnesses' person's-eye tests (included
//! with `#[path]`, so each test binary builds only this).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Whether tmux runs here; with PREFIXSCOPE_REQUIRE_TMUX set (CI), a missing tmux fails.
pub fn have_tmux() -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("PREFIXSCOPE_REQUIRE_TMUX").is_none(),
            "tmux is required here (PREFIXSCOPE_REQUIRE_TMUX is set) but not installed"
        );
        eprintln!("SKIPPED: tmux is not installed");
    }
    ok
}

/// One tmux server per test (its own socket), killed on drop.
pub struct Tmux {
    pub socket: String,
    pub dir: PathBuf,
    /// How long `wait_for` and `wait_until` wait.
    pub patience: Duration,
}

impl Tmux {
    pub fn start(name: &str, command: &str) -> Tmux {
        Tmux::start_sized(name, command, 120, 40)
    }

    pub fn start_sized(name: &str, command: &str, width: u16, height: u16) -> Tmux {
        let dir =
            std::env::temp_dir().join(format!("prefixscope-tmux-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let tmux = Tmux {
            socket: format!("prefixscope-{name}-{}", std::process::id()),
            dir,
            patience: Duration::from_secs(15),
        };
        // -u and a UTF-8 locale: the screens hold box drawing and "…" whatever the machine's
        // locale.
        let status = Command::new("tmux")
            .args([
                "-u",
                "-L",
                &tmux.socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                &width.to_string(),
                "-y",
                &height.to_string(),
            ])
            .arg("-c")
            .arg(&tmux.dir)
            .arg(command)
            .env("TERM", "xterm-256color")
            .env("LANG", "C.UTF-8")
            .status()
            .unwrap();
        assert!(status.success());
        tmux
    }

    pub fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn keys(&self, keys: &[&str]) {
        let status = Command::new("tmux")
            .args(["-L", &self.socket, "send-keys"])
            .args(keys)
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (up to `patience`) until the screen contains every one of `texts`.
    pub fn wait_for(&self, texts: &[&str]) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if texts.iter().all(|t| screen.contains(t)) {
                return screen;
            }
            assert!(
                start.elapsed() < self.patience,
                "waited for {texts:?}; the screen is:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (up to `patience`) until `done` holds for the screen.
    pub fn wait_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < self.patience,
                "waited for {what}; the screen is:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pid of the prefixscope process the pane's shell started (waits up to 15 s for it).
    pub fn program_pid(&self) -> String {
        let shell = self.display("#{pane_pid}");
        let start = Instant::now();
        loop {
            let out = Command::new("pgrep")
                .args(["-P", &shell, "-x", "prefixscope"])
                .output()
                .unwrap();
            let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !pid.is_empty() {
                return pid;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "no prefixscope under the pane's shell {shell}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A tmux format of the pane, e.g. `#{alternate_on}`.
    pub fn display(&self, format: &str) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "display-message", "-p", format])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Alternate screen, cursor shown, mouse reporting: "1 0 1" in the TUI (mouse on), "0 1 0"
    /// in a restored terminal.
    pub fn modes(&self) -> String {
        self.display("#{alternate_on} #{cursor_flag} #{mouse_any_flag}")
    }

    pub fn files(&self, prefix: &str) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .collect();
        found.sort();
        found
    }

    /// Kills the tmux server: the terminal the program runs in disappears, as when its window
    /// is closed.
    pub fn kill_server(&self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.kill_server();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
