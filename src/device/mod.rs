//! Host memory for batches. This layer knows bytes and buffers, never events: [`staging`]
//! hands out aligned host buffers from a bounded pool, and the pipeline fills them through
//! [`crate::batch`]. (The CUDA path, with pinned staging and double-buffered device copies,
//! is to come here; see the README.)

pub mod staging;
