//! Reading datasets.
