//! Measurement: baselines over the source Parquet ([`baselines`]), shuffle quality
//! ([`quality`]), one whole run ([`report`]), the bound every throughput is compared with
//! ([`memcpy_gb_per_s`]), how far apart the loader's cores are ([`hand_off`]), and which
//! machine it all ran on ([`machine`]).

pub mod baselines;
pub mod data;
pub mod hand_off;
pub mod machine;
pub mod plot;
pub mod quality;
pub mod report;
pub mod stages;

use std::time::Instant;

/// `bytes` over `seconds` in GB/s (a zero duration counts as a nanosecond).
pub fn gb_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds.max(1e-9) / 1e9
}

/// The median of `n` measurements (these machines are shared: one pass can land on another
/// tenant's burst).
pub fn median_of<E>(n: usize, mut measure: impl FnMut() -> Result<f64, E>) -> Result<f64, E> {
    let values = (0..n.max(1))
        .map(|_| measure())
        .collect::<Result<Vec<_>, E>>()?;
    Ok(median(&values))
}

/// The median of `values` (of an even count, the mean of the middle two); NaN when there
/// are none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// memcpy bandwidth in GB/s with `threads` threads, each copying `chunk`-byte pieces of its
/// share of `source` into one reused buffer (as a loader copies into a reused staging
/// buffer): the bound a loader's delivered GB/s is measured against, in the same run.
pub fn memcpy_gb_per_s(source: &[u8], chunk: usize, threads: usize) -> f64 {
    let threads = threads.max(1);
    let chunk = chunk.clamp(1, (source.len() / threads).max(1));
    let per_thread = source.len() / threads;
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let part = &source[t * per_thread..(t + 1) * per_thread];
            s.spawn(move || {
                let mut dst = vec![0u8; chunk];
                for piece in part.chunks_exact(chunk) {
                    dst.copy_from_slice(piece);
                    std::hint::black_box(&dst);
                }
            });
        }
    });
    (per_thread / chunk * chunk * threads) as f64 / started.elapsed().as_secs_f64().max(1e-9) / 1e9
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_is_the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[0.7]), 0.7);
        assert!(median(&[]).is_nan());
    }
}
