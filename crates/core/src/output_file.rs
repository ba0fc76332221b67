//! Files prefixscope writes, made safely. An output never replaces anything it did not create
//! as a regular file:
//!
//! - a regular file (or nothing yet) is written to a new temporary file beside the target,
//!   created `O_EXCL | O_NOFOLLOW` with mode 0600, and renamed over the target only once the
//!   write succeeded; a symlink at the target is replaced, never written through; the target
//!   being one of the inputs (the same device and inode, hard links included, or a symlink to
//!   one) is refused before anything is written; a failed write, a panic or a stopping signal
//!   ([`exit_removing_temporaries`]) removes the temporary file and leaves an existing target as it was;
//! - a character device or a FIFO (`/dev/null`, `/dev/stdout`, a named pipe), or a symlink to
//!   one, is opened and written as it is: replacing `/dev/null` with a file breaks every
//!   program on the machine;
//! - `-` is standard output;
//! - a block device, a directory or a socket is refused.
//!
//! Streamed recordings (`record -o`, `watch -o`, rotation) are created new with
//! [`create_new_private`]: never an existing file, never through a symlink.
//!
//! An edge (files), but with no dependency beyond std and libc's flag values: the recorder,
//! which builds without the `net` feature, uses it too.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Opens a new file only this user can read: `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600. An
/// existing file, or a symlink (even one pointing nowhere), is `AlreadyExists`.
pub fn create_new_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    options.open(path)
}

/// How an output path is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// `-`: standard output.
    Stdout,
    /// An existing character device or FIFO, or a symlink to one: opened and written as it is.
    Stream,
    /// A regular file or nothing yet (a symlink to either is replaced): written whole through a
    /// temporary file.
    File,
}

impl OutputKind {
    /// Whether the output is a file of its own (`File`), where a second output (an HTML page)
    /// can go beside it.
    pub fn is_file(self) -> bool {
        self == OutputKind::File
    }
}

/// How `target` would be written, or why it cannot be (`InvalidInput`: a block device, a
/// directory, a socket).
pub fn output_kind(target: &Path) -> io::Result<OutputKind> {
    if target.as_os_str() == "-" {
        return Ok(OutputKind::Stdout);
    }
    let meta = match std::fs::symlink_metadata(target) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(OutputKind::File),
        Err(e) => return Err(e),
    };
    let meta = if meta.file_type().is_symlink() {
        match std::fs::metadata(target) {
            // A symlink to a regular file, or to nothing: the link itself is replaced.
            Ok(pointed) if pointed.is_file() => return Ok(OutputKind::File),
            Ok(pointed) => pointed,
            Err(_) => return Ok(OutputKind::File),
        }
    } else {
        meta
    };
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(OutputKind::File);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() || kind.is_fifo() {
            return Ok(OutputKind::Stream);
        }
    }
    let what = if kind.is_dir() {
        "a directory"
    } else {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if kind.is_block_device() {
                "a block device"
            } else if kind.is_socket() {
                "a socket"
            } else {
                "not a file"
            }
        }
        #[cfg(not(unix))]
        "not a file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is {what}: an output is a regular file (made new or replaced whole), a character device or FIFO (written as it is), or - for standard output",
            target.display()
        ),
    ))
}

/// The identity of a file: device and inode.
#[cfg(unix)]
fn identity(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// The input `target` is, if it is one and writing `target` would replace it: the same file
/// (device and inode, so a hard link or a second path to it counts), the symlink itself given
/// as an input, or a symlink to an input. A device, a FIFO or `-` is written as it is and
/// replaces nothing, so it is never an input here.
pub fn input_at(target: &Path, inputs: &[&Path]) -> Option<PathBuf> {
    if !matches!(output_kind(target), Ok(OutputKind::File)) {
        return None;
    }
    #[cfg(unix)]
    {
        let of = |path: &Path| {
            [std::fs::metadata(path), std::fs::symlink_metadata(path)]
                .into_iter()
                .filter_map(Result::ok)
                .map(|m| identity(&m))
                .collect::<Vec<_>>()
        };
        let target_ids = of(target);
        if target_ids.is_empty() {
            return None;
        }
        inputs
            .iter()
            .find(|input| of(input).iter().any(|id| target_ids.contains(id)))
            .map(|input| input.to_path_buf())
    }
    #[cfg(not(unix))]
    {
        let target = target.canonicalize().ok()?;
        inputs
            .iter()
            .find(|input| input.canonicalize().is_ok_and(|i| i == target))
            .map(|input| input.to_path_buf())
    }
}

/// The error `OutputFile::create` gives for a target that is one of the inputs
/// (`ErrorKind::InvalidInput`: a usage error).
fn is_an_input(target: &Path, input: &Path) -> io::Error {
    let same = if input == target {
        String::new()
    } else {
        format!(" ({} is the same file)", input.display())
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is one of the inputs{same}: writing it would destroy what is read; choose another file",
            target.display()
        ),
    )
}

/// The temporary files being written now, removed by [`exit_removing_temporaries`] when a signal
/// stops the process before their `OutputFile`s are dropped.
static TEMPORARIES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn temporaries() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    TEMPORARIES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes every temporary file of an `OutputFile` not yet committed, then exits with `code`:
/// what a stopping signal does. The list stays locked until the process is gone, so an output
/// created meanwhile is not left behind.
pub fn exit_removing_temporaries(code: i32) -> ! {
    let held = temporaries();
    for temp in held.iter() {
        let _ = std::fs::remove_file(temp);
    }
    std::process::exit(code);
}

fn forget_temporary(temp: &Path) {
    temporaries().retain(|t| t != temp);
}

/// Where an `OutputFile` writes.
enum Writer {
    File(io::BufWriter<File>),
    Stdout(io::BufWriter<io::Stdout>),
}

/// A whole-file output being written. For a regular file, a temporary file beside the target
/// until `commit` renames it over the target; dropped uncommitted (an error, a panic), the
/// temporary file is removed and the target is untouched. A device, FIFO or standard output is
/// written directly (`OutputKind`).
pub struct OutputFile {
    target: PathBuf,
    /// The temporary file, while there is one to rename or remove.
    temp: Option<PathBuf>,
    writer: Option<Writer>,
}

static TEMP_COUNTER: AtomicU32 = AtomicU32::new(0);

impl OutputFile {
    /// Opens `target` as `output_kind` says. For a regular file: refuses a target that is one
    /// of `inputs`, then creates the temporary file (`.NAME.prefixscope-PID-N.tmp` in the
    /// target's directory, 0600, `O_EXCL | O_NOFOLLOW`).
    pub fn create(target: &Path, inputs: &[&Path]) -> io::Result<OutputFile> {
        let direct = |writer| OutputFile {
            target: target.to_path_buf(),
            temp: None,
            writer: Some(writer),
        };
        match output_kind(target)? {
            OutputKind::Stdout => {
                return Ok(direct(Writer::Stdout(io::BufWriter::new(io::stdout()))));
            }
            OutputKind::Stream => {
                let file = OpenOptions::new().write(true).open(target)?;
                // Replaced by a regular file since `output_kind` looked: not written into.
                if file.metadata()?.is_file() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{} changed while it was opened", target.display()),
                    ));
                }
                return Ok(direct(Writer::File(io::BufWriter::with_capacity(
                    1 << 16,
                    file,
                ))));
            }
            OutputKind::File => {}
        }
        if let Some(input) = input_at(target, inputs) {
            return Err(is_an_input(target, &input));
        }
        let name = target
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
            .to_string_lossy()
            .into_owned();
        let dir = match target.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut last = None;
        for _ in 0..64 {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let temp = dir.join(format!(
                ".{name}.prefixscope-{}-{n}.tmp",
                std::process::id()
            ));
            // Registered before it exists, so a signal in between still removes it.
            temporaries().push(temp.clone());
            match create_new_private(&temp) {
                Ok(file) => {
                    return Ok(OutputFile {
                        target: target.to_path_buf(),
                        temp: Some(temp),
                        writer: Some(Writer::File(io::BufWriter::with_capacity(1 << 16, file))),
                    });
                }
                Err(e) => {
                    forget_temporary(&temp);
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        return Err(e);
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no temporary file name free")))
    }

    /// The file it writes.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Flushes; for a regular file, syncs and renames the temporary file over the target.
    pub fn commit(mut self) -> io::Result<()> {
        let file = match self.writer.take() {
            None => return Err(io::Error::other("already committed")),
            Some(Writer::Stdout(mut stdout)) => return stdout.flush(),
            Some(Writer::File(writer)) => writer.into_inner().map_err(|e| e.into_error())?,
        };
        let Some(temp) = &self.temp else {
            return Ok(());
        };
        file.sync_all()?;
        drop(file);
        std::fs::rename(temp, &self.target)?;
        // Renamed: nothing left for `Drop` to remove.
        forget_temporary(temp);
        self.temp = None;
        Ok(())
    }

    fn writer(&mut self) -> io::Result<&mut dyn Write> {
        match self.writer.as_mut() {
            Some(Writer::File(file)) => Ok(file),
            Some(Writer::Stdout(stdout)) => Ok(stdout),
            None => Err(io::Error::other("already committed")),
        }
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writer()?.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.writer()?.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.writer.is_some() {
            true => self.writer()?.flush(),
            false => Ok(()),
        }
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        self.writer = None;
        if let Some(temp) = self.temp.take() {
            let _ = std::fs::remove_file(&temp);
            forget_temporary(&temp);
        }
    }
}

/// Writes `bytes` as the whole of `target` (see the module: temporary file and rename for a
/// regular file, a device or FIFO written as it is, inputs refused).
pub fn write_whole(target: &Path, inputs: &[&Path], bytes: &[u8]) -> io::Result<()> {
    let mut out = OutputFile::create(target, inputs)?;
    out.write_all(bytes)?;
    out.commit()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("prefixscope-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    #[test]
    fn a_new_output_is_private_and_an_old_one_is_replaced_private() {
        let dir = dir("modes");
        let new = dir.join("new.json");
        write_whole(&new, &[], b"one\n").unwrap();
        assert_eq!(std::fs::read(&new).unwrap(), b"one\n");
        assert_eq!(mode(&new), 0o600);
        let old = dir.join("old.json");
        std::fs::write(&old, "before").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_whole(&old, &[], b"after").unwrap();
        assert_eq!(std::fs::read(&old).unwrap(), b"after");
        assert_eq!(mode(&old), 0o600);
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn a_symlink_at_the_target_is_replaced_not_followed() {
        let dir = dir("symlink");
        let victim = dir.join("victim.txt");
        std::fs::write(&victim, "keep me").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.join("out.json");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        write_whole(&link, &[], b"report").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert_eq!(mode(&victim), 0o644);
        assert!(!std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(&link).unwrap(), b"report");
        // A dangling symlink too.
        let dangling = dir.join("dangling.json");
        std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
        write_whole(&dangling, &[], b"x").unwrap();
        assert!(!dir.join("nowhere").exists());
        assert_eq!(std::fs::read(&dangling).unwrap(), b"x");
    }

    #[test]
    fn the_input_itself_a_hard_link_to_it_or_a_symlink_to_it_is_refused() {
        let dir = dir("inputs");
        let input = dir.join("in.jsonl");
        std::fs::write(&input, "recorded\n").unwrap();
        let hard = dir.join("hard.jsonl");
        std::fs::hard_link(&input, &hard).unwrap();
        let soft = dir.join("soft.jsonl");
        std::os::unix::fs::symlink(&input, &soft).unwrap();
        let other_name = dir.join(".").join("in.jsonl");
        for target in [&input, &hard, &soft, &other_name] {
            let e = OutputFile::create(target, &[input.as_path()])
                .err()
                .unwrap();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{target:?}");
            assert!(e.to_string().contains("is one of the inputs"), "{e}");
        }
        // The input given through the symlink, the output at the real file.
        assert!(OutputFile::create(&input, &[soft.as_path()]).is_err());
        assert_eq!(std::fs::read(&input).unwrap(), b"recorded\n");
        assert!(leftovers(&dir).is_empty());
        // Another file is fine.
        write_whole(&dir.join("out.jsonl"), &[input.as_path()], b"ok").unwrap();
    }

    #[test]
    fn a_failed_write_leaves_the_existing_file_and_no_temporary_file() {
        let dir = dir("failed");
        let target = dir.join("report.json");
        std::fs::write(&target, "the old report").unwrap();
        {
            let mut out = OutputFile::create(&target, &[]).unwrap();
            out.write_all(b"half a new").unwrap();
            // The writer fails here: dropped without commit.
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"the old report");
        assert!(leftovers(&dir).is_empty());
        // A directory that does not exist: an error, nothing created.
        assert!(write_whole(&dir.join("missing/report.json"), &[], b"x").is_err());
    }

    #[test]
    fn new_private_files_refuse_existing_files_and_symlinks() {
        let dir = dir("new");
        let path = dir.join("rec.jsonl");
        drop(create_new_private(&path).unwrap());
        assert_eq!(mode(&path), 0o600);
        assert_eq!(
            create_new_private(&path).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let link = dir.join("link.jsonl");
        std::os::unix::fs::symlink(dir.join("target"), &link).unwrap();
        assert!(create_new_private(&link).is_err());
        assert!(!dir.join("target").exists());
    }

    #[test]
    fn output_kinds_follow_what_is_at_the_path() {
        let dir = dir("kinds");
        assert_eq!(output_kind(Path::new("-")).unwrap(), OutputKind::Stdout);
        assert_eq!(output_kind(&dir.join("new")).unwrap(), OutputKind::File);
        std::fs::write(dir.join("old"), "x").unwrap();
        assert_eq!(output_kind(&dir.join("old")).unwrap(), OutputKind::File);
        // /dev/null is only looked at here, never opened for writing.
        assert_eq!(
            output_kind(Path::new("/dev/null")).unwrap(),
            OutputKind::Stream
        );
        std::os::unix::fs::symlink("/dev/null", dir.join("to-null")).unwrap();
        assert_eq!(
            output_kind(&dir.join("to-null")).unwrap(),
            OutputKind::Stream
        );
        std::os::unix::fs::symlink(dir.join("old"), dir.join("to-old")).unwrap();
        assert_eq!(output_kind(&dir.join("to-old")).unwrap(), OutputKind::File);
        let e = output_kind(&dir).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("is a directory"), "{e}");
        // A device is never one of the inputs: writing it replaces nothing.
        assert_eq!(
            input_at(Path::new("/dev/null"), &[Path::new("/dev/null")]),
            None
        );
    }
}
