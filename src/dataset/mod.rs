//! Reading a dataset directory: the manifest and its memory-mapped shards, plus the
//! whole-dataset tools built on them ([`inspect`], [`dump`], [`verify`]).

pub mod copy;
pub mod dump;
pub(crate) mod fault_report;
pub mod huge_pages;
pub mod inspect;
mod kept;
mod sizes;
pub mod verify;
mod view;

pub use kept::KeptEvents;
pub use sizes::DatasetSizes;
pub use view::{Counts, View};

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, IoContext, Result};
use crate::format::names::{self, Level};
use crate::format::records::DecodedColumns;
use crate::format::safetensors::{self, Header};
use crate::format::{
    checksum, Manifest, RecordView, SensorTable, ShardEntry, ShardLayout, ShardProblem, ShardView,
    StoredView, Validation,
};

/// The share of this process's memory (the machine's, or its cgroup limit) a dataset may
/// take for its shards to be read into huge pages ([`Dataset::open`]): half, so that the
/// page cache holds it beside the job.
pub const HUGE_PAGES_MEMORY_SHARE: f64 = 0.5;

/// Whether shards of `dataset_bytes` fit in [`HUGE_PAGES_MEMORY_SHARE`] of `memory` bytes
/// (`None`: unknown, so no).
fn page_cache_holds(dataset_bytes: u64, memory: Option<u64>) -> bool {
    memory.is_some_and(|m| dataset_bytes as f64 <= m as f64 * HUGE_PAGES_MEMORY_SHARE)
}

/// The size of a memory page on this system (4096 where it cannot be asked).
pub fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system; no memory is involved.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// When shard checksums are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChecksumPolicy {
    /// Every shard when the dataset is opened.
    Full,
    /// Each shard when it is first opened.
    #[default]
    Lazy,
    /// Never (sizes and structure are still checked).
    Off,
}

/// The bytes of a shard: a memory map, or the file read into memory where mapping fails.
enum ShardBytes {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl ShardBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            ShardBytes::Mapped(m) => m,
            ShardBytes::Read(v) => v,
        }
    }
}

/// What [`Shard::open`] reads of a shard before handing it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstRead {
    /// Its header and offsets only; the rest as events are read.
    Structure,
    /// All of it, in order, to check its checksum. With `huge_pages`, its map is first
    /// advised `MADV_HUGEPAGE`, so that a shard not in the page cache comes into it as
    /// 2 MiB folios (filesystems with large folios: ext4 from Linux 6.16, xfs), which the
    /// loader's reads then map with one TLB entry each (see [`Dataset::open`]).
    Checksum {
        /// Ask for huge pages first.
        huge_pages: bool,
    },
}

/// One open shard: its bytes and validated header.
pub struct Shard {
    path: PathBuf,
    bytes: ShardBytes,
    header: Header,
    sensor_rows: usize,
    layout: ShardLayout,
}

/// A shard's columns: a columns shard's own, or a records shard's decoded into memory
/// ([`Shard::columns`]).
pub enum Columns<'a> {
    /// Views into a columns shard's bytes.
    Stored(ShardView<'a>),
    /// A records shard's columns, decoded.
    Decoded(Box<DecodedColumns<'a>>),
}

impl Columns<'_> {
    /// The columns' view.
    pub fn view(&self) -> ShardView<'_> {
        match self {
            Columns::Stored(view) => *view,
            Columns::Decoded(decoded) => decoded.view(),
        }
    }
}

impl Shard {
    /// Maps `path`, checks its size against `entry` (and its checksum, as `first_read`
    /// says), and validates its header and structure in `layout`, and every sensor id
    /// against a `sensor_rows`-row sensor table.
    pub fn open(
        path: &Path,
        entry: &ShardEntry,
        sensor_rows: usize,
        layout: ShardLayout,
        first_read: FirstRead,
    ) -> Result<Shard> {
        let file = File::open(path).at(path)?;
        let len = file.metadata().at(path)?.len();
        if len != entry.bytes {
            return Err(Error::shard(
                path,
                ShardProblem::Size {
                    found: len,
                    expected: entry.bytes,
                },
            ));
        }
        // SAFETY: the map is read-only and shards are immutable once renamed into place (the
        // converter never rewrites one); a file truncated by someone else while mapped
        // faults its reader, the standard caveat of memory-mapped readers, which
        // `fault_report` turns into a line naming the file before the process ends.
        let bytes = match unsafe { memmap2::Mmap::map(&file) } {
            Ok(map) => {
                fault_report::report_faults_on_mapped_files();
                ShardBytes::Mapped(map)
            }
            Err(e) => {
                tracing::warn!(
                    "{}: cannot memory-map ({e}); reading it into memory instead",
                    path.display()
                );
                ShardBytes::Read(std::fs::read(path).at(path)?)
            }
        };
        if let FirstRead::Checksum { huge_pages } = first_read {
            if let (true, ShardBytes::Mapped(map)) = (huge_pages, &bytes) {
                if let Err(e) = map.advise(memmap2::Advice::HugePage) {
                    // A hint: kernels without transparent huge pages refuse it.
                    tracing::debug!("{}: no huge pages ({e})", path.display());
                }
            }
            checksum::verify(path, bytes.as_slice(), &entry.xxh3)?;
        }
        let header =
            safetensors::parse(bytes.as_slice()).map_err(|problem| Error::shard(path, problem))?;
        let shard = Shard {
            path: path.to_path_buf(),
            bytes,
            header,
            sensor_rows,
            layout,
        };
        let view = shard.parse(Validation::Full)?;
        let found = [view.events(), view.doms(), view.pulses()].map(|n| n as u64);
        let expected = [entry.events, entry.doms, entry.pulses];
        if found != expected {
            return Err(Error::shard(path, ShardProblem::Counts { found, expected }));
        }
        Ok(shard)
    }

    fn parse(&self, validation: Validation) -> Result<StoredView<'_>> {
        let (bytes, header, rows) = (self.bytes.as_slice(), &self.header, self.sensor_rows);
        match self.layout {
            ShardLayout::Columns => {
                ShardView::parse(bytes, header, rows, validation).map(StoredView::Columns)
            }
            ShardLayout::Records => {
                RecordView::parse(bytes, header, rows, validation).map(StoredView::Records)
            }
        }
        .map_err(|problem| Error::shard(&self.path, problem))
    }

    /// Typed views of the shard's tensors, in its layout (what was validated when it was
    /// opened is not checked again).
    pub fn stored(&self) -> Result<StoredView<'_>> {
        self.parse(Validation::Structure)
    }

    /// The shard's columns: views of a columns shard's, or a records shard's decoded into
    /// memory (as many bytes as its DOM and pulse data: drop them when done).
    pub fn columns(&self) -> Result<Columns<'_>> {
        Ok(match self.stored()? {
            StoredView::Columns(view) => Columns::Stored(view),
            StoredView::Records(view) => Columns::Decoded(Box::new(view.decode())),
        })
    }

    /// The shard's layout.
    pub fn layout(&self) -> ShardLayout {
        self.layout
    }

    /// The shard's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The safetensors header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Asks the kernel to read ahead every column's bytes of events `events` (when the shard
    /// is memory-mapped): the reads that follow then find them in the page cache, and a
    /// cold read becomes a few large reads instead of a page fault per column and block.
    pub fn read_ahead(&self, events: std::ops::Range<usize>) -> Result<()> {
        let ShardBytes::Mapped(map) = &self.bytes else {
            return Ok(());
        };
        let view = self.stored()?;
        let events = events.start.min(view.events())..events.end.min(view.events());
        let event_doms = view.event_tensors().dom_offsets;
        let doms = event_doms[events.start] as usize..event_doms[events.end] as usize;
        let pulses = view.pulse_range(events.clone());
        let records = match view {
            StoredView::Records(v) => v.record_bytes(events.clone()),
            StoredView::Columns(_) => 0..0,
        };
        for (name, tensor) in &self.header.tensors {
            let items = match (name.as_str(), names::level(name)) {
                (names::EVENT_RECORDS, _) => records.clone(),
                (names::EVENT_DOM_OFFSETS | names::EVENT_PULSE_OFFSETS, _) => {
                    events.start..events.end + 1
                }
                (names::DOM_PULSE_OFFSETS, _) => doms.start..doms.end + 1,
                (_, Level::Event) => events.clone(),
                (_, Level::Dom) => doms.clone(),
                (_, Level::Pulse) => pulses.clone(),
            };
            let size = tensor.dtype.size();
            let start = tensor.range.start + items.start * size;
            let len = (items.len() * size).min(tensor.range.end - start);
            if len > 0 {
                map.advise_range(memmap2::Advice::WillNeed, start, len)
                    .at(&self.path)?;
            }
        }
        Ok(())
    }

    /// The fraction of the shard's pages in the page cache (1 when it was read into memory
    /// rather than mapped; 0 when the kernel cannot tell).
    pub fn resident_fraction(&self) -> f64 {
        let ShardBytes::Mapped(map) = &self.bytes else {
            return 1.0;
        };
        if map.is_empty() {
            return 1.0;
        }
        let page = page_size();
        let mut flags = vec![0u8; map.len().div_ceil(page)];
        // SAFETY: the range is the whole live mapping (page-aligned, as every mapping is) and
        // `flags` holds one byte per page of it, as mincore writes.
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), flags.as_mut_ptr()) };
        if rc != 0 {
            return 0.0;
        }
        flags.iter().filter(|&&f| f & 1 == 1).count() as f64 / flags.len() as f64
    }

    /// Drops this process's mappings of the shard's pages (the next access reads them
    /// again, from the page cache or the disk): a page mapped by a process stays in the
    /// page cache whatever `posix_fadvise` asks.
    fn unmap_pages(&self) -> Result<()> {
        if let ShardBytes::Mapped(map) = &self.bytes {
            // SAFETY: the map is a read-only shared mapping of an immutable file, so after
            // MADV_DONTNEED every page reads back the same bytes from the file: no reference
            // into the map observes a change.
            unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) }.at(&self.path)?;
        }
        Ok(())
    }
}

/// Asks the kernel to drop `path` from the page cache (unmapped pages only), as for a cold
/// read; no root needed.
pub fn evict_file(path: &Path) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let file = File::open(path).at(path)?;
        // SAFETY: the descriptor is open for the duration of the call; the advice only
        // affects caching, never the file's contents.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(Error::io(path, std::io::Error::from_raw_os_error(rc)));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "evicting a file from the page cache needs Linux",
            ),
        ))
    }
}

/// An open dataset directory.
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    sensor_table: SensorTable,
    /// What opening a shard reads of it: the policy's checksum, with or without huge
    /// pages (see [`Dataset::open`]).
    first_read: FirstRead,
    shards: Vec<OnceLock<Shard>>,
    /// One lock per shard, held while it is opened: a thread that needs a shard another
    /// thread is opening waits for it instead of checksumming and validating it again
    /// (the workers and the waiting thread reach a new shard together).
    opening: Vec<Mutex<()>>,
    /// Shards opened (checksummed and validated) so far, for the tests.
    #[cfg(test)]
    opened: std::sync::atomic::AtomicUsize,
}

impl Dataset {
    /// Opens `dir` and reads its sensor table (checksummed unless the policy is
    /// [`ChecksumPolicy::Off`]); with [`ChecksumPolicy::Full`] every shard is opened and
    /// checked now.
    ///
    /// A dataset the page cache can hold (at most [`HUGE_PAGES_MEMORY_SHARE`] of the memory
    /// this process can have) has each shard read at its checksum into huge pages
    /// ([`FirstRead::Checksum`]): measured on the 2-core VM (Linux 6.18, ext4), shards read
    /// back from the disk that way were 99% mapped in huge pages against 77% without the
    /// hint, and the loader then delivered 5% more events/s at window 16 and 7% at window
    /// 64 (docs/results.md, "Shards in huge pages"). A larger dataset is left to the
    /// kernel's defaults: its evicted pages would come back 2 MiB at a time, where the
    /// loader wants a block's piece of a column (40-150 KB).
    pub fn open(dir: &Path, policy: ChecksumPolicy) -> Result<Dataset> {
        let manifest = Manifest::read(dir)?;
        let first_read = match policy {
            ChecksumPolicy::Off => FirstRead::Structure,
            ChecksumPolicy::Full | ChecksumPolicy::Lazy => FirstRead::Checksum {
                huge_pages: page_cache_holds(
                    manifest.totals.bytes,
                    crate::device::memory::available().map(|m| m.bytes),
                ),
            },
        };
        let sensor_table =
            SensorTable::read(dir, &manifest.sensor_table, policy != ChecksumPolicy::Off)?;
        let count = manifest.shards.len();
        let dataset = Dataset {
            dir: dir.to_path_buf(),
            manifest,
            sensor_table,
            first_read,
            shards: (0..count).map(|_| OnceLock::new()).collect(),
            opening: (0..count).map(|_| Mutex::new(())).collect(),
            #[cfg(test)]
            opened: Default::default(),
        };
        if policy == ChecksumPolicy::Full {
            for i in 0..dataset.shards.len() {
                dataset.shard(i)?;
            }
        }
        Ok(dataset)
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The sensor table: every sensor's position, by sensor id (a shard's
    /// `dom_sensor_id` is a row of it).
    pub fn sensor_table(&self) -> &SensorTable {
        &self.sensor_table
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether shards read whole at their checksum ask for huge pages first (the dataset
    /// fits in [`HUGE_PAGES_MEMORY_SHARE`] of this process's memory, and the checksum
    /// policy reads shards whole; see [`Dataset::open`]).
    pub fn asks_for_huge_pages(&self) -> bool {
        self.first_read == FirstRead::Checksum { huge_pages: true }
    }

    /// The number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Drops every shard and the sensor table from the page cache (this process's mappings
    /// first), so the next reads come from the disk: how benches measure cold reads.
    pub fn evict_from_page_cache(&self) -> Result<()> {
        for (i, entry) in self.manifest.shards.iter().enumerate() {
            if let Some(shard) = self.shards[i].get() {
                shard.unmap_pages()?;
            }
            evict_file(&self.dir.join(&entry.file))?;
        }
        evict_file(&self.dir.join(&self.manifest.sensor_table.file))
    }

    /// The shards opened so far (by a read, or by [`ChecksumPolicy::Full`] at open).
    pub fn opened_shards(&self) -> impl Iterator<Item = &Shard> {
        self.shards.iter().filter_map(OnceLock::get)
    }

    /// Shard `i` (in global order), opened on first use.
    pub fn shard(&self, i: usize) -> Result<&Shard> {
        if let Some(shard) = self.shards[i].get() {
            return Ok(shard);
        }
        // A failed open leaves the lock unpoisoned (it returns an error, never panics
        // holding it) and the shard unopened: the next caller tries again.
        let _opening = self.opening[i].lock().unwrap_or_else(|e| e.into_inner());
        if let Some(shard) = self.shards[i].get() {
            return Ok(shard); // opened by the thread this one waited for
        }
        #[cfg(test)]
        self.opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let entry = &self.manifest.shards[i];
        let shard = Shard::open(
            &self.dir.join(&entry.file),
            entry,
            self.sensor_table.rows(),
            self.manifest.schema.layout,
            self.first_read,
        )?;
        Ok(self.shards[i].get_or_init(|| shard))
    }
}

/// The committed fixture (`fixtures/kaggle-mini`, train split) converted under `dir` in
/// shards of about 64 KiB (several of them), opened with lazy checksums.
#[cfg(test)]
pub(crate) fn small_shards_fixture(dir: &Path) -> Dataset {
    use crate::convert::{convert_in_one_go, ConvertOptions};
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kaggle-mini");
    let options = ConvertOptions {
        shard_target_bytes: 64 << 10,
        ..ConvertOptions::default()
    };
    let out = dir.join("ds");
    convert_in_one_go(&fixture, Some("train"), &out, &options).unwrap();
    Dataset::open(&out, ChecksumPolicy::Lazy).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_reaching_a_new_shard_together_open_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let dataset = small_shards_fixture(dir.path());
        let shards = dataset.shard_count();
        assert!(shards >= 2, "several shards, each reached by every thread");
        let threads = 8;
        let start = std::sync::Barrier::new(threads);
        let opened: Vec<Vec<usize>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        (0..shards)
                            .map(|i| dataset.shard(i).unwrap() as *const Shard as usize)
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            opened.iter().all(|o| *o == opened[0]),
            "one Shard per shard"
        );
        assert_eq!(
            dataset.opened.load(std::sync::atomic::Ordering::Relaxed),
            shards,
            "each shard checksummed and validated once, whoever waited for it"
        );
    }

    #[test]
    fn huge_pages_are_asked_for_datasets_within_half_the_memory() {
        let gib = 1u64 << 30;
        assert!(page_cache_holds(8 * gib, Some(16 * gib)));
        assert!(!page_cache_holds(8 * gib + 1, Some(16 * gib)));
        assert!(
            !page_cache_holds(250 * gib, Some(128 * gib)),
            "the full Kaggle set"
        );
        assert!(
            !page_cache_holds(1, None),
            "memory unknown: the kernel's defaults"
        );
    }
}
