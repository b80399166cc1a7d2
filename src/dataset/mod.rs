//! Reading a dataset directory: the manifest and its memory-mapped shards, plus the
//! whole-dataset tools built on them ([`inspect`], [`dump`], [`verify`]).

pub mod dump;
pub mod inspect;
pub mod verify;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, IoContext, Result};
use crate::format::safetensors::{self, Header};
use crate::format::{checksum, Manifest, ShardEntry, ShardView};

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

/// One open shard: its bytes and validated header.
pub struct Shard {
    path: PathBuf,
    bytes: ShardBytes,
    header: Header,
}

impl Shard {
    /// Maps `path`, checks its size against `entry` (and its checksum when asked), and
    /// validates its header and structure.
    pub fn open(path: &Path, entry: &ShardEntry, check_checksum: bool) -> Result<Shard> {
        let file = File::open(path).at(path)?;
        let len = file.metadata().at(path)?.len();
        if len != entry.bytes {
            return Err(Error::shard(
                path,
                format!("is {len} bytes, the manifest says {}", entry.bytes),
            ));
        }
        // SAFETY: the map is read-only and shards are immutable once renamed into place (the
        // converter never rewrites one); a file truncated by someone else while mapped would
        // fault, which is the standard caveat of memory-mapped readers.
        let bytes = match unsafe { memmap2::Mmap::map(&file) } {
            Ok(map) => ShardBytes::Mapped(map),
            Err(e) => {
                tracing::warn!(
                    "{}: cannot memory-map ({e}); reading it into memory instead",
                    path.display()
                );
                ShardBytes::Read(std::fs::read(path).at(path)?)
            }
        };
        if check_checksum {
            let found = checksum::of_bytes(bytes.as_slice());
            if found != entry.xxh3 {
                return Err(Error::Checksum {
                    path: path.to_path_buf(),
                    expected: entry.xxh3.clone(),
                    found,
                });
            }
        }
        let header =
            safetensors::parse(bytes.as_slice()).map_err(|problem| Error::shard(path, problem))?;
        let shard = Shard {
            path: path.to_path_buf(),
            bytes,
            header,
        };
        let view = ShardView::parse(&shard.path, shard.bytes.as_slice(), &shard.header)?;
        let counts = (
            view.events() as u64,
            view.doms() as u64,
            view.pulses() as u64,
        );
        if counts != (entry.events, entry.doms, entry.pulses) {
            return Err(Error::shard(
                path,
                format!(
                    "holds {counts:?} events/DOMs/pulses, the manifest says ({}, {}, {})",
                    entry.events, entry.doms, entry.pulses
                ),
            ));
        }
        Ok(shard)
    }

    /// Typed views of the shard's tensors (the offsets were validated when it was opened).
    pub fn view(&self) -> Result<ShardView<'_>> {
        ShardView::parse_with(&self.path, self.bytes.as_slice(), &self.header, false)
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
}

/// An open dataset directory.
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    policy: ChecksumPolicy,
    shards: Vec<OnceLock<Shard>>,
}

impl Dataset {
    /// Opens `dir`; with [`ChecksumPolicy::Full`] every shard is opened and checked now.
    pub fn open(dir: &Path, policy: ChecksumPolicy) -> Result<Dataset> {
        let manifest = Manifest::read(dir)?;
        let shards = (0..manifest.shards.len())
            .map(|_| OnceLock::new())
            .collect();
        let dataset = Dataset {
            dir: dir.to_path_buf(),
            manifest,
            policy,
            shards,
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

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Shard `i` (in global order), opened on first use.
    pub fn shard(&self, i: usize) -> Result<&Shard> {
        if let Some(shard) = self.shards[i].get() {
            return Ok(shard);
        }
        let entry = &self.manifest.shards[i];
        let shard = Shard::open(
            &self.dir.join(&entry.file),
            entry,
            self.policy != ChecksumPolicy::Off,
        )?;
        Ok(self.shards[i].get_or_init(|| shard))
    }
}
