//! The files a fleet command reads: snapshot files, folders searched
//! recursively, globs, and folders of site tables.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use snapdiff_fleet::{Unreadable, is_table_folder};

use snapdiff_format::names::{SNAPSHOT_EXTENSIONS, is_capture_file, is_snapshot_name};

/// What the paths given name.
#[derive(Debug, Default)]
pub(crate) struct Inputs {
    /// Snapshot files, folders' contents in name order.
    pub(crate) snapshots: Vec<PathBuf>,
    /// Folders of site tables (`snapdiff export`'s output).
    pub(crate) table_folders: Vec<PathBuf>,
    /// Files and folders inside the folders given that could not be read:
    /// named, and the rest read.
    pub(crate) unreadable: Vec<Unreadable>,
    /// What was taken already: a file or folder reached by two paths
    /// (overlapping arguments, a link back into the folder) is read once.
    seen: HashSet<FileId>,
}

/// What a file is, whatever path reaches it: its device and inode, or
/// elsewhere its canonical path.
#[derive(Debug, PartialEq, Eq, Hash)]
enum FileId {
    #[cfg(unix)]
    Inode(u64, u64),
    #[cfg(not(unix))]
    Path(PathBuf),
}

impl FileId {
    fn of(path: &Path) -> Option<FileId> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(path).ok()?;
            Some(FileId::Inode(m.dev(), m.ino()))
        }
        #[cfg(not(unix))]
        {
            Some(FileId::Path(std::fs::canonicalize(path).ok()?))
        }
    }
}

impl Inputs {
    /// Takes `path` as a snapshot file if it is a regular file (where
    /// links lead): a FIFO would block the read forever and a device
    /// (`/dev/zero`) never end, so they are named and left out.
    fn take_file(&mut self, path: &Path) {
        if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            self.snapshots.push(path.to_path_buf());
        } else {
            self.unreadable.push(Unreadable {
                source: path.to_string_lossy().into_owned(),
                error: format!(
                    "{}: not a regular file (a FIFO, device or socket is never read)",
                    crate::output::shown(path)
                ),
            });
        }
    }

    /// Whether `path` is new (else it was taken through another path).
    fn first_time(&mut self, path: &Path) -> bool {
        FileId::of(path).is_none_or(|id| self.seen.insert(id))
    }
}

/// `paths`, and those listed in `from` (`-`: standard input): NUL-separated
/// when the list holds a NUL byte (names may hold newlines), else one a
/// line; empty entries are passed over.
pub(crate) fn with_paths_from(
    paths: &[PathBuf],
    from: Option<&Path>,
) -> anyhow::Result<Vec<PathBuf>> {
    use std::io::Read;
    let mut all = paths.to_vec();
    let Some(from) = from else {
        return Ok(all);
    };
    let mut list = Vec::new();
    let read = if from == Path::new("-") {
        std::io::stdin().lock().read_to_end(&mut list)
    } else {
        std::fs::File::open(from).and_then(|mut f| f.read_to_end(&mut list))
    };
    read.map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", crate::output::shown(from)))?;
    let separator = if list.contains(&0) { 0 } else { b'\n' };
    for entry in list.split(|&b| b == separator) {
        let entry = if separator == b'\n' {
            entry.strip_suffix(b"\r").unwrap_or(entry)
        } else {
            entry
        };
        if !entry.is_empty() {
            all.push(path_of_bytes(entry));
        }
    }
    if all.is_empty() {
        anyhow::bail!("{}: lists no path", crate::output::shown(from));
    }
    Ok(all)
}

/// A path from the bytes of its name.
fn path_of_bytes(bytes: &[u8]) -> PathBuf {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
    }
    #[cfg(not(unix))]
    {
        PathBuf::from(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// Whether `path` names snapshots by a pattern: it does not exist and holds
/// `*`, `?` or `[`.
fn is_pattern(path: &Path) -> bool {
    !path.exists() && path.to_str().is_some_and(|p| p.contains(['*', '?', '[']))
}

/// The inputs `paths` name. A folder is searched recursively for files with
/// a snapshot's extension and for site-table folders (whose own files are
/// not searched); a file is taken whatever its name, except the files
/// capture writes beside its dumps (so `fleet snapshots/*` reads a capture's
/// folder as `fleet snapshots` does).
pub(crate) fn find(paths: &[PathBuf]) -> anyhow::Result<Inputs> {
    let mut inputs = Inputs::default();
    for path in paths {
        if is_pattern(path) {
            let text = path.to_string_lossy();
            let matches = glob::glob(&text).map_err(|e| {
                anyhow::anyhow!("{}: not a valid pattern: {e}", crate::output::shown(path))
            })?;
            let mut found = 0;
            for entry in matches {
                let entry = entry.map_err(|e| anyhow::anyhow!("{e}"))?;
                found += 1;
                add(&entry, &mut inputs)?;
            }
            if found == 0 {
                anyhow::bail!(
                    "{}: no file matches this pattern",
                    crate::output::shown(path)
                );
            }
        } else {
            add(path, &mut inputs)?;
        }
    }
    if inputs.snapshots.is_empty()
        && inputs.table_folders.is_empty()
        && inputs.unreadable.is_empty()
    {
        anyhow::bail!(
            "no snapshot files in {} (looked for .{})",
            paths
                .iter()
                .map(|p| crate::output::shown(p))
                .collect::<Vec<_>>()
                .join(", "),
            SNAPSHOT_EXTENSIONS.join(", .")
        );
    }
    // Needed only while looking: 100,000 files' identities are megabytes.
    inputs.seen = HashSet::new();
    Ok(inputs)
}

fn add(path: &Path, inputs: &mut Inputs) -> anyhow::Result<()> {
    if !path.is_dir() {
        if !path.exists() {
            // Named, and the rest judged: a file that vanished between a
            // listing and its reading (a Ray task's batch) fails alone.
            inputs.unreadable.push(Unreadable {
                source: path.to_string_lossy().into_owned(),
                error: format!("{}: no such file or folder", crate::output::shown(path)),
            });
            return Ok(());
        }
        if !is_capture_file(path) && inputs.first_time(path) {
            inputs.take_file(path);
        }
        return Ok(());
    }
    let mut walk = walkdir::WalkDir::new(path)
        .follow_links(true)
        .sort_by_file_name()
        .into_iter();
    while let Some(entry) = walk.next() {
        let entry = match entry {
            Ok(entry) => entry,
            // A link back to a folder above: that folder is read already.
            Err(e) if e.loop_ancestor().is_some() => continue,
            Err(e) => {
                let at = e.path().unwrap_or(path).to_path_buf();
                inputs.unreadable.push(Unreadable {
                    source: at.to_string_lossy().into_owned(),
                    error: format!("{}: cannot read: {e}", crate::output::shown(&at)),
                });
                continue;
            }
        };
        let p = entry.path();
        if entry.file_type().is_dir() {
            if is_table_folder(p) {
                refuse_tables_beside_snapshots(p)?;
                if inputs.first_time(p) {
                    inputs.table_folders.push(p.to_path_buf());
                }
                walk.skip_current_dir();
            }
            continue;
        }
        if is_snapshot_name(p) && inputs.first_time(p) {
            inputs.take_file(p);
        }
    }
    Ok(())
}

/// A folder of site tables that holds snapshot files too is refused: read
/// as tables, the snapshots written there since would be passed over; read
/// as both, the ranks the tables were made from would count twice.
fn refuse_tables_beside_snapshots(folder: &Path) -> anyhow::Result<()> {
    let snapshots = std::fs::read_dir(folder)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| is_snapshot_name(&e.path()) && e.path().is_file())
                .count()
        })
        .unwrap_or(0);
    if snapshots > 0 {
        anyhow::bail!(
            "{}: holds site tables and {snapshots} snapshot file{} together: give the snapshots \
             or the tables (export into a folder of its own)",
            crate::output::shown(folder),
            if snapshots == 1 { "" } else { "s" }
        );
    }
    Ok(())
}
