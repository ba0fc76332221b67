//! Exports as the `e` key and `prefixscope export` share them: the inputs opened for each pass,
//! and the salt file. Ids are salted with a key kept in a salt file: `--salt-file`, else
//! `$XDG_CONFIG_HOME/prefixscope/salt`, else `~/.config/prefixscope/salt`; created on first use
//! (32 random bytes as hex, mode 0600) and reused after, so exports of the same traffic share ids.

use std::fs::File;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use prefixscope_core::export::{self, ExportError, Inputs, Options, Salt, Target};
use prefixscope_core::input::{self, Format};
use prefixscope_core::output_file::OutputFile;

/// The input files, opened again for each pass.
pub struct Files<'a> {
    pub paths: &'a [PathBuf],
}

impl Inputs for Files<'_> {
    fn count(&self) -> usize {
        self.paths.len()
    }

    fn name(&self, index: usize) -> String {
        self.paths
            .get(index)
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    fn open(&self, index: usize) -> std::io::Result<Box<dyn BufRead + '_>> {
        match self.paths.get(index) {
            Some(path) => input::open_decompressed(path),
            None => Err(std::io::Error::other("no such input")),
        }
    }
}

/// `$XDG_CONFIG_HOME/prefixscope/salt`, else `~/.config/prefixscope/salt`.
pub fn default_salt_path() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    set("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".config")))
        .map(|config| config.join("prefixscope").join("salt"))
}

fn random_hex(bytes: usize) -> String {
    use std::io::Read;
    let mut buffer = vec![0u8; bytes];
    let from_os = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buffer));
    if from_os.is_err() {
        // No /dev/urandom: std's per-process random hash keys, mixed with the clock.
        use std::hash::{BuildHasher, Hasher};
        for (i, chunk) in buffer.chunks_mut(8).enumerate() {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_usize(i);
            hasher.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default(),
            );
            let word = hasher.finish().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
    buffer.iter().map(|b| format!("{b:02x}")).collect()
}

/// A salt as read from its file.
#[derive(Debug, Clone, PartialEq)]
pub struct SaltFile {
    pub salt: Salt,
    /// The file did not exist and was created.
    pub created: bool,
    /// Something the user should fix (a salt file others can read).
    pub warning: Option<String>,
}

/// Reads the salt file, creating it (mode 0600) when it does not exist.
pub fn load_or_create_salt(path: &Path) -> Result<SaltFile, String> {
    let read = |path: &Path| -> Result<Option<Salt>, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => Salt::from_text(&text)
                .map(Some)
                .ok_or_else(|| format!("salt file {} is empty", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read salt file {}: {e}", path.display())),
        }
    };
    if let Some(salt) = read(path)? {
        let mut warning = None;
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                warning = Some(format!(
                    "salt file {} is readable by others (mode {mode:o}); chmod 600 it",
                    path.display()
                ));
            }
        }
        return Ok(SaltFile {
            salt,
            created: false,
            warning,
        });
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let text = random_hex(32);
    // Only this user can read it; never an existing file, never through a symlink.
    match prefixscope_core::output_file::create_new_private(path) {
        Ok(mut file) => {
            file.write_all(format!("{text}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("cannot write salt file {}: {e}", path.display()))?;
            let salt = Salt::from_text(&text)
                .ok_or_else(|| format!("salt file {} is empty", path.display()))?;
            Ok(SaltFile {
                salt,
                created: true,
                warning: None,
            })
        }
        // Another export created it meanwhile: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(path)?
            .map(|salt| SaltFile {
                salt,
                created: false,
                warning: None,
            })
            .ok_or_else(|| format!("salt file {} is empty", path.display())),
        Err(e) => Err(format!("cannot create salt file {}: {e}", path.display())),
    }
}

/// The TUI's `e` key: exports what was recorded or replayed (read again from disk: the app
/// keeps no bodies) to `path` with the format's default block size and the default salt file,
/// saying what it did in one line (nothing on stderr: the TUI owns the terminal).
pub fn export_files(files: &[PathBuf], to: &str, path: &str) -> Result<String, String> {
    let salt_path = default_salt_path()
        .ok_or("no place for the salt file (neither XDG_CONFIG_HOME nor HOME is set)")?;
    export_files_salted(files, to, path, &salt_path)
}

/// Numbered names an export tries after the one asked for.
const MAX_NAME_TRIES: u32 = 1_000;

/// `path` if nothing is there, else `NAME-2.EXT`, `NAME-3.EXT`… (`None` past the tries).
fn free_name(path: &Path) -> Option<PathBuf> {
    if std::fs::symlink_metadata(path).is_err() {
        return Some(path.to_path_buf());
    }
    let stem = path.file_stem()?.to_string_lossy().into_owned();
    let extension = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    (2..=MAX_NAME_TRIES + 1)
        .map(|n| path.with_file_name(format!("{stem}-{n}{extension}")))
        .find(|candidate| std::fs::symlink_metadata(candidate).is_err())
}

/// [`export_files`] with the salt file given.
pub fn export_files_salted(
    files: &[PathBuf],
    to: &str,
    path: &str,
    salt_path: &Path,
) -> Result<String, String> {
    let asked = Path::new(path.trim());
    if asked.as_os_str().is_empty() {
        return Err("no file name".into());
    }
    // An export never replaces a file: a second `e` with the same name gets the next free one.
    let free = free_name(asked).ok_or_else(|| {
        format!(
            "{} and its next {MAX_NAME_TRIES} numbered names exist",
            asked.display()
        )
    })?;
    let path = free.as_path();
    let target = Target::parse(to).ok_or_else(|| format!("unknown format {to:?}"))?;
    let salt = load_or_create_salt(salt_path)?.salt;
    let block_size = target.default_block_size().unwrap_or(16);
    let options = Options {
        target,
        block_size,
        salt,
        tools_position: None,
        ts_column: None,
    };
    // A 0600 temporary file renamed over `path` once the export is whole: a symlink there is
    // replaced, a recording being read is refused, a failed export leaves the old file.
    let input_paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let mut out = OutputFile::create(path, &input_paths)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let inputs = Files { paths: files };
    // The replayed files' own format (a recording, a trace, a gateway log).
    let format = files
        .first()
        .and_then(|path| input::open(path, None).ok())
        .map_or(Format::Recording, |opened| opened.format);
    let result = export::export(&inputs, format, &options, &mut out)
        .and_then(|s| out.commit().map(|()| s).map_err(ExportError::Write));
    match result {
        Ok(summary) => Ok(format!(
            "exported {} requests to {} ({}{}{})",
            summary.requests,
            path.display(),
            target.as_str(),
            if target.default_block_size().is_some() {
                format!(", {block_size}-token blocks")
            } else {
                String::new()
            },
            if target.anonymous() {
                ", anonymized"
            } else {
                ", NOT anonymous: it carries the messages"
            }
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("prefixscope-salt-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        dir
    }

    #[test]
    fn a_salt_file_is_created_once_private_and_then_reused() {
        let dir = temp_dir("create");
        let path = dir.join("nested/salt");
        let SaltFile {
            salt: first,
            created,
            ..
        } = load_or_create_salt(&path).unwrap();
        assert!(created);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 64);
        assert!(text.trim().chars().all(|c| c.is_ascii_hexdigit()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&path), 0o600);
            assert_eq!(mode(&dir.join("nested")), 0o700);
        }
        let SaltFile {
            salt: again,
            created,
            ..
        } = load_or_create_salt(&path).unwrap();
        assert!(!created);
        assert_eq!(first, again);
        // Two new salts differ.
        let other = load_or_create_salt(&dir.join("other")).unwrap().salt;
        assert_ne!(first, other);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn an_empty_salt_file_is_an_error() {
        let dir = temp_dir("empty");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("salt");
        std::fs::write(&path, "\n").unwrap();
        assert!(load_or_create_salt(&path).is_err_and(|e| e.contains("empty")));
        std::fs::remove_dir_all(&dir).ok();
    }
}
