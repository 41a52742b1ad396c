//! The files a fleet command reads: snapshot files, folders searched
//! recursively, globs, and folders of site tables.
//!
//! They are walked twice. A census first: how many files each process has,
//! which files more than one path may reach. Then a second walk hands on
//! each process's files as soon as the last of them is found, so that a
//! job of 100,000 files is never held as a list of 100,000 paths: what is
//! held is the paths of processes not yet complete (in a folder a node,
//! a few), and a count a process.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use snapdiff_format::names::{SNAPSHOT_EXTENSIONS, is_capture_file, is_snapshot_name};

use crate::process::{process_named, wanted};

/// The files of a site-table folder (`snapdiff export`'s output). The
/// last, what kept sites' blocks alive (`capture --owners`), may be missing
/// from folders written before it was.
pub const TABLE_FILES: [&str; 4] = [
    "sites.parquet",
    "checkpoints.parquet",
    "stacks.parquet",
    "owners.parquet",
];

/// Whether `dir` is a site-table folder (it holds `sites.parquet`).
pub fn is_table_folder(dir: &Path) -> bool {
    dir.join(TABLE_FILES[0]).is_file()
}

/// A file that could not be read, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    /// The file, as given.
    pub source: String,
    /// Why, in one line.
    pub error: String,
}

/// `path` as a line of text may show it: escaped.
fn shown(path: &Path) -> String {
    snapdiff_format::visible::escaped(&path.display().to_string()).into_owned()
}

/// What a file or folder is, whatever path reaches it: its device and
/// inode, or elsewhere its canonical path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum FileId {
    #[cfg(unix)]
    Inode(u64, u64),
    #[cfg(not(unix))]
    Path(PathBuf),
}

impl FileId {
    fn of(path: &Path, metadata: &std::fs::Metadata) -> Option<FileId> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let _ = path;
            Some(FileId::Inode(metadata.dev(), metadata.ino()))
        }
        #[cfg(not(unix))]
        {
            let _ = metadata;
            Some(FileId::Path(std::fs::canonicalize(path).ok()?))
        }
    }

    fn of_path(path: &Path) -> Option<FileId> {
        FileId::of(path, &std::fs::metadata(path).ok()?)
    }
}

/// Whether another path than this one may reach the file: a link, a file
/// of several names (hard links), or a path given by hand (which a folder
/// given too may hold). Only such files are remembered to be read once.
fn may_be_reached_twice(metadata: &std::fs::Metadata, link: bool, given: bool) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        link || given || metadata.nlink() > 1
    }
    #[cfg(not(unix))]
    {
        let _ = (metadata, link, given);
        true
    }
}

/// What a walk of the inputs finds, in order.
enum Found<'a> {
    /// A regular file read as a snapshot.
    Snapshot {
        path: &'a Path,
        len: u64,
        id: Option<FileId>,
        /// See [`may_be_reached_twice`].
        shared: bool,
    },
    /// A folder of site tables (`snapdiff export`'s output).
    Tables(&'a Path),
    /// A file or folder that cannot be read: named, and the rest read.
    Unreadable(Unreadable),
}

/// The first walk: what the inputs hold, and what the second walk needs to
/// hand on each process's files once all are found.
#[derive(Debug)]
pub struct Census {
    /// Folders of site tables, in walk order.
    pub table_folders: Vec<PathBuf>,
    /// Files and folders that could not be read.
    pub unreadable: Vec<Unreadable>,
    /// Snapshot files found (of the process asked for), for the progress
    /// bar: a file reached by two paths counts twice here.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The number of paths found to each process's files, by the process
    /// their names say.
    remaining: HashMap<String, usize>,
    /// Files that more than one path may reach.
    shared: HashSet<FileId>,
    paths: Vec<PathBuf>,
    only: Option<String>,
    skip: Option<Skip>,
}

/// A folder left out of the walk (`export`'s own output).
#[derive(Debug)]
struct Skip {
    id: FileId,
    canonical: PathBuf,
}

/// Counts what `paths` hold (the first walk): of the process `only` asks
/// for (see [`wanted`]), all when `None`; the folder `skip` and what it
/// holds left out (`export`'s output is never its input).
pub fn census(
    paths: &[PathBuf],
    only: Option<&str>,
    skip: Option<&Path>,
) -> anyhow::Result<Census> {
    let skip = skip.and_then(|folder| {
        Some(Skip {
            id: FileId::of_path(folder)?,
            canonical: std::fs::canonicalize(folder).ok()?,
        })
    });
    // Any snapshot file, of any process: `--rank 9` of a job without
    // rank 9 says so, not that the folder holds no snapshots.
    let mut any_snapshot = false;
    let mut census = Census {
        table_folders: Vec::new(),
        unreadable: Vec::new(),
        files: 0,
        bytes: 0,
        remaining: HashMap::new(),
        shared: HashSet::new(),
        paths: paths.to_vec(),
        only: only.map(str::to_owned),
        skip,
    };
    walk(
        &census.paths,
        census.skip.as_ref(),
        &mut |found| match found {
            Found::Snapshot {
                path,
                len,
                id,
                shared,
            } => {
                let name = process_named(path);
                any_snapshot = true;
                if !name.is_empty() && !wanted(&name, only) {
                    return;
                }
                census.files += 1;
                census.bytes = census.bytes.saturating_add(len);
                if shared {
                    census.shared.extend(id);
                }
                if !name.is_empty() {
                    *census.remaining.entry(name).or_default() += 1;
                }
            }
            Found::Tables(folder) => census.table_folders.push(folder.to_path_buf()),
            Found::Unreadable(u) => census.unreadable.push(u),
        },
    )?;
    if !any_snapshot && census.table_folders.is_empty() && census.unreadable.is_empty() {
        anyhow::bail!(
            "no snapshot files in {} (looked for .{})",
            paths
                .iter()
                .map(|p| shown(p))
                .collect::<Vec<_>>()
                .join(", "),
            SNAPSHOT_EXTENSIONS.join(", .")
        );
    }
    Ok(census)
}

impl Census {
    /// The process asked for, if one was.
    pub fn only(&self) -> Option<&str> {
        self.only.as_deref()
    }

    /// Walks again, handing each process's files (in the order found) to
    /// `group` as soon as the last of them is found; files reached by two
    /// paths are handed on once. Processes whose files were not all found
    /// again (some were removed since), and files whose names say no
    /// process (named once read, as one group ""), are handed on at the
    /// end; named files the census did not count are left out. Returns why
    /// the walk stopped early, if it did.
    pub fn stream(mut self, mut group: impl FnMut(String, Vec<PathBuf>)) -> Option<Unreadable> {
        let mut pending: HashMap<String, Vec<PathBuf>> = HashMap::new();
        let mut unnamed = Vec::new();
        let mut seen = HashSet::new();
        let only = self.only.as_deref();
        let walked = walk(&self.paths, self.skip.as_ref(), &mut |found| {
            let Found::Snapshot { path, id, .. } = found else {
                return;
            };
            let name = process_named(path);
            if !name.is_empty() && !wanted(&name, only) {
                return;
            }
            let again = id.is_some_and(|id| self.shared.contains(&id) && !seen.insert(id));
            if name.is_empty() {
                if !again {
                    unnamed.push(path.to_path_buf());
                }
                return;
            }
            // A process the census did not count (or counted, and handed
            // on) has files written since the census: left out, as files
            // written after the command would be.
            let Some(remaining) = self.remaining.get_mut(&name) else {
                return;
            };
            *remaining -= 1;
            let complete = *remaining == 0;
            if complete {
                self.remaining.remove(&name);
                // Given back as processes are handed on, so that the
                // counts of a job's ranks are not all held to the end.
                if self.remaining.len() < self.remaining.capacity() / 4 {
                    self.remaining.shrink_to_fit();
                }
            }
            if !again {
                pending
                    .entry(name.clone())
                    .or_default()
                    .push(path.to_path_buf());
            }
            if complete && let Some(files) = pending.remove(&name) {
                group(name, files);
            }
        });
        let left: BTreeMap<String, Vec<PathBuf>> = pending.into_iter().collect();
        for (name, files) in left {
            group(name, files);
        }
        if !unnamed.is_empty() {
            group(String::new(), unnamed);
        }
        walked.err().map(|e| Unreadable {
            source: self
                .paths
                .first()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            error: snapdiff_format::visible::escaped(&e.to_string()).into_owned(),
        })
    }
}

/// `paths`, and those listed in `from` (`-`: standard input): NUL-separated
/// when the list holds a NUL byte (names may hold newlines), else one a
/// line; empty entries are passed over.
pub fn with_paths_from(paths: &[PathBuf], from: Option<&Path>) -> anyhow::Result<Vec<PathBuf>> {
    use std::io::Read;
    let mut all = paths.to_vec();
    let Some(from) = from else {
        return Ok(all);
    };
    let mut list = Vec::new();
    let read = if from == Path::new("-") {
        std::io::stdin()
            .lock()
            .take(MAX_PATHS_BYTES)
            .read_to_end(&mut list)
    } else {
        open_list(from).and_then(|f| f.take(MAX_PATHS_BYTES).read_to_end(&mut list))
    };
    read.map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", shown(from)))?;
    if list.len() as u64 >= MAX_PATHS_BYTES {
        anyhow::bail!(
            "{}: cannot read: a list of paths of {} or more",
            shown(from),
            snapdiff_format::units::format_size(MAX_PATHS_BYTES)
        );
    }
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
        anyhow::bail!("{}: lists no path", shown(from));
    }
    Ok(all)
}

/// A path from the bytes of its name.
/// The most `--paths-from` reads: 10 million paths of 100 bytes.
const MAX_PATHS_BYTES: u64 = 1 << 30;

/// Opens the list `--paths-from` names: a regular file, or a pipe (as
/// `<(find ...)` gives), never a device.
fn open_list(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::metadata(path)?.file_type();
    if kind.is_fifo() {
        return std::fs::File::open(path);
    }
    snapdiff_format::open_regular(path)
}

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

/// Walks what `paths` name, handing each find to `visit` in order. A folder
/// is searched recursively, names in order, each folder once however many
/// paths reach it, for files with a snapshot's extension and for
/// site-table folders (whose own files are not searched); a file is taken
/// whatever its name, except the files capture writes beside its dumps (so
/// `fleet snapshots/*` reads a capture's folder as `fleet snapshots`
/// does); a pattern is expanded. Only regular files are snapshots: a FIFO
/// would block the read forever and a device (`/dev/zero`) never end.
fn walk(
    paths: &[PathBuf],
    skip: Option<&Skip>,
    visit: &mut dyn FnMut(Found<'_>),
) -> anyhow::Result<()> {
    let mut folders = HashSet::new();
    for path in paths {
        if is_pattern(path) {
            let text = path.to_string_lossy();
            let matches = glob::glob(&text)
                .map_err(|e| anyhow::anyhow!("{}: not a valid pattern: {e}", shown(path)))?;
            let mut found = 0;
            for entry in matches {
                let entry = entry.map_err(|e| anyhow::anyhow!("{e}"))?;
                found += 1;
                walk_path(&entry, skip, &mut folders, visit)?;
            }
            if found == 0 {
                anyhow::bail!("{}: no file matches this pattern", shown(path));
            }
        } else {
            walk_path(path, skip, &mut folders, visit)?;
        }
    }
    Ok(())
}

/// [`walk`] of one path; `folders` are those walked already.
fn walk_path(
    path: &Path,
    skip: Option<&Skip>,
    folders: &mut HashSet<FileId>,
    visit: &mut dyn FnMut(Found<'_>),
) -> anyhow::Result<()> {
    if !path.is_dir() {
        if !path.exists() {
            // Named, and the rest judged: a file that vanished between a
            // listing and its reading (a Ray task's batch) fails alone.
            visit(Found::Unreadable(Unreadable {
                source: path.to_string_lossy().into_owned(),
                error: format!("{}: no such file or folder", shown(path)),
            }));
            return Ok(());
        }
        let skipped = skip.is_some_and(|s| {
            std::fs::canonicalize(path).is_ok_and(|p| p.starts_with(&s.canonical))
        });
        if !is_capture_file(path) && !skipped {
            visit_file(path, false, true, visit);
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
                visit(Found::Unreadable(Unreadable {
                    source: at.to_string_lossy().into_owned(),
                    error: format!("{}: cannot read: {e}", shown(&at)),
                }));
                continue;
            }
        };
        let p = entry.path();
        if entry.file_type().is_dir() {
            let id = entry.metadata().ok().and_then(|m| FileId::of(p, &m));
            let walked_already =
                id.is_some_and(|id| skip.is_some_and(|s| s.id == id) || !folders.insert(id));
            if walked_already {
                walk.skip_current_dir();
            } else if is_table_folder(p) {
                refuse_tables_beside_snapshots(p)?;
                visit(Found::Tables(p));
                walk.skip_current_dir();
            }
            continue;
        }
        if is_snapshot_name(p) {
            visit_file(p, entry.path_is_symlink(), false, visit);
        }
    }
    Ok(())
}

/// Hands `path` to `visit` as a snapshot if it is a regular file (where
/// links lead), else as unreadable; `link`, `given`: see
/// [`may_be_reached_twice`].
fn visit_file(path: &Path, link: bool, given: bool, visit: &mut dyn FnMut(Found<'_>)) {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => visit(Found::Snapshot {
            path,
            len: m.len(),
            id: FileId::of(path, &m),
            shared: may_be_reached_twice(&m, link, given),
        }),
        _ => visit(Found::Unreadable(Unreadable {
            source: path.to_string_lossy().into_owned(),
            error: format!(
                "{}: not a regular file (a FIFO, device or socket is never read)",
                shown(path)
            ),
        })),
    }
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
            shown(folder),
            if snapshots == 1 { "" } else { "s" }
        );
    }
    Ok(())
}
