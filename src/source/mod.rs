//! The input side: Kaggle-layout Parquet files and the sensor geometry, decoded and
//! validated into [`RawEvent`](crate::event::RawEvent)s.

pub mod batch;
pub mod columns;
pub mod geometry;
pub mod layout;
pub mod meta;

pub use batch::scan_batch;
pub use geometry::Geometry;
pub use layout::{BatchInput, InputSet};
pub use meta::{has_labels, read_batch_meta, BatchMeta, MetaRow};
