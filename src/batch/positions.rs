//! `dom_position`: each DOM's row of the sensor table, looked up by the batch's own sensor
//! ids once its columns are copied.
//!
//! The table's padded rows ([`LookupRows`]) are 16 or 32 bytes on cache-line-aligned
//! memory, so a row is one load that never straddles two lines. Where the CPU has AVX-512,
//! F64 rows are moved in groups of 8 (one load per row, three two-source permutes and
//! three full 64-byte stores per group, instead of a 24-byte store per row, a quarter of
//! them across two lines): the loader delivered 4-5% more events a second at windows 1 to
//! 64 on a 2-core Zen 5 (docs/results.md). F32 rows, other CPUs and a group's tail go one
//! row at a time.

use crate::format::pod::Pod;
use crate::format::{IntColumn, LookupRows, SensorTable};

/// Writes the sensor-table rows of DOMs `doms` (x, y, z each) to the start of `out` (raw
/// bytes of the table's dtype, aligned to it). A sensor id outside the table panics: the
/// shards were checked against it when opened.
pub(super) fn look_up_positions(
    sensors: IntColumn,
    doms: std::ops::Range<usize>,
    table: &SensorTable,
    out: &mut [u8],
) {
    let out = &mut out[..doms.len() * 3 * table.dtype().size()];
    match (sensors, table.lookup_rows()) {
        (IntColumn::I16(s), LookupRows::F32(t)) => write_rows(&s[doms], t, out),
        (IntColumn::I16(s), LookupRows::F64(t)) => write_rows(&s[doms], t, out),
        (IntColumn::I32(s), LookupRows::F32(t)) => write_rows(&s[doms], t, out),
        (IntColumn::I32(s), LookupRows::F64(t)) => write_rows(&s[doms], t, out),
        (IntColumn::I64(s), LookupRows::F32(t)) => write_rows(&s[doms], t, out),
        (IntColumn::I64(s), LookupRows::F64(t)) => write_rows(&s[doms], t, out),
    }
}

/// A sensor id's integer type.
trait SensorId: Copy {
    /// The table row it names (a negative id wraps to one far out of any table).
    fn row(self) -> usize;
}

impl<S: Copy + Into<i64>> SensorId for S {
    #[inline]
    fn row(self) -> usize {
        self.into() as usize
    }
}

/// A coordinate's type, with the widest way this CPU has to move rows of it.
trait Coordinate: Pod {
    /// Writes the rows of the first DOMs, in whole groups; returns how many it wrote (none
    /// where this CPU has no wider way than one row at a time).
    fn write_groups<S: SensorId>(
        sensors: &[S],
        table: &[[Self; 4]],
        out: &mut [[Self; 3]],
    ) -> usize {
        let _ = (sensors, table, out);
        0
    }
}

impl Coordinate for f64 {
    fn write_groups<S: SensorId>(sensors: &[S], table: &[[f64; 4]], out: &mut [[f64; 3]]) -> usize {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, checked just above.
            return unsafe { avx512::rows_f64(sensors, table, out) };
        }
        let _ = (sensors, table, out);
        0
    }
}

/// One row at a time: groups of 16 F32 rows (four 16-byte loads and three inserts per
/// register) measured no faster than single rows (0.45 ns per DOM either way, 2-core Zen 5).
impl Coordinate for f32 {}

/// Each DOM's row, in groups where the CPU can, the rest one by one.
fn write_rows<S: SensorId, T: Coordinate>(sensors: &[S], table: &[[T; 4]], out: &mut [u8]) {
    let out = rows_mut(out, sensors.len());
    let done = T::write_groups(sensors, table, out);
    write_rows_one_by_one(&sensors[done..], table, &mut out[done..]);
}

/// Each DOM's row as one 3-value move (one bounds check).
fn write_rows_one_by_one<S: SensorId, T: Pod>(sensors: &[S], table: &[[T; 4]], out: &mut [[T; 3]]) {
    for (dst, &s) in out.iter_mut().zip(sensors) {
        let row = &table[s.row()];
        *dst = [row[0], row[1], row[2]];
    }
}

/// The first `rows` rows of 3 values of `out`.
fn rows_mut<T: Pod>(out: &mut [u8], rows: usize) -> &mut [[T; 3]] {
    let values = crate::format::pod::try_cast_mut::<T>(out)
        .expect("the position section is aligned to its dtype");
    &mut values.as_chunks_mut::<3>().0[..rows]
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! F64 rows moved in groups of 8: their padded rows are loaded into four registers (two
    //! rows each), and three two-source permutes drop every fourth value, leaving the
    //! group's x, y, z rows in three full registers, stored as they are.

    use super::SensorId;
    use std::arch::x86_64::*;

    /// From registers `a` (lanes 0-7) and `b` (8-15) holding rows of four F64, the values
    /// of output registers 0, 1, 2: rows 0-1 and 2-3, then 2-3 and 4-5, then 4-5 and 6-7.
    const LANES: [[i64; 8]; 3] = [
        [0, 1, 2, 4, 5, 6, 8, 9],
        [2, 4, 5, 6, 8, 9, 10, 12],
        [5, 6, 8, 9, 10, 12, 13, 14],
    ];

    /// Writes the rows of the first multiple of 8 DOMs; returns how many.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn rows_f64<S: SensorId>(
        sensors: &[S],
        table: &[[f64; 4]],
        out: &mut [[f64; 3]],
    ) -> usize {
        // SAFETY: unaligned loads of 8 i64 from arrays of 8.
        let lanes = unsafe {
            [
                _mm512_loadu_si512(LANES[0].as_ptr().cast()),
                _mm512_loadu_si512(LANES[1].as_ptr().cast()),
                _mm512_loadu_si512(LANES[2].as_ptr().cast()),
            ]
        };
        let (groups, _) = sensors.as_chunks::<8>();
        let (outs, _) = out.as_chunks_mut::<8>();
        for (s, out) in groups.iter().zip(outs.iter_mut()) {
            let rows = s.map(|s| table[s.row()].as_ptr());
            // SAFETY: unaligned loads of rows of 4 values (32 bytes), each in the table.
            let z = unsafe {
                [0, 2, 4, 6].map(|r| {
                    let low = _mm512_castsi256_si512(_mm256_loadu_si256(rows[r].cast()));
                    _mm512_inserti64x4::<1>(low, _mm256_loadu_si256(rows[r + 1].cast()))
                })
            };
            let o = out.as_mut_ptr().cast::<__m512i>();
            for k in 0..3 {
                let values = _mm512_permutex2var_epi64(z[k], lanes[k], z[k + 1]);
                // SAFETY: the group's 8 rows of 3 F64 are 3 * 64 bytes: register k fits.
                unsafe { _mm512_storeu_si512(o.add(k), values) };
            }
        }
        groups.len().min(outs.len()) * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::pod::as_bytes;
    use crate::format::safetensors::Dtype;

    /// A table of `rows` rows with distinct coordinates (NaN rows among them, as for ids
    /// the geometry does not list), and sensor ids drawn over all of it.
    fn table_and_ids(rows: usize, dtype: Dtype, n: usize) -> (SensorTable, Vec<i64>) {
        let xyz: Vec<f64> = (0..3 * rows)
            .map(|v| match v / 3 % 7 {
                3 => f64::NAN,
                _ => v as f64 * 0.37 - 500.0,
            })
            .collect();
        let mut rng = crate::rng::Rng::new(0x2545_f491_4f6c_dd1d);
        let ids = (0..n).map(|_| rng.below(rows as u64) as i64).collect();
        (SensorTable::new(&xyz, dtype), ids)
    }

    /// The positions `look_up_positions` writes for `ids` as `column`'s type, widened.
    fn looked_up(table: &SensorTable, column: IntColumn, n: usize, from: usize) -> Vec<f64> {
        let size = table.dtype().size();
        let mut out = crate::format::pod::LineAligned::zeroed(3 * n * size);
        look_up_positions(column, from..from + n, table, out.bytes_mut());
        let bytes = &out.bytes()[..3 * n * size];
        match table.dtype() {
            Dtype::F64 => crate::format::pod::try_cast::<f64>(bytes).unwrap().to_vec(),
            _ => crate::format::pod::try_cast::<f32>(bytes)
                .unwrap()
                .iter()
                .map(|&v| f64::from(v))
                .collect(),
        }
    }

    #[test]
    fn every_dom_gets_its_sensors_row_for_every_id_type_dtype_and_length() {
        for dtype in [Dtype::F64, Dtype::F32] {
            let (table, ids) = table_and_ids(5160, dtype, 200);
            let (i16s, i32s): (Vec<i16>, Vec<i32>) =
                ids.iter().map(|&i| (i as i16, i as i32)).unzip();
            // Lengths around the group size (8) and its multiples, from offsets that are
            // not a group's.
            for n in [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 62, 100, 197] {
                for from in [0, 3] {
                    let columns = [
                        IntColumn::I16(&i16s),
                        IntColumn::I32(&i32s),
                        IntColumn::I64(&ids),
                    ];
                    for column in columns {
                        let got = looked_up(&table, column, n, from);
                        assert_eq!(got.len(), 3 * n);
                        for (d, &id) in ids[from..from + n].iter().enumerate() {
                            for k in 0..3 {
                                let (value, stored) =
                                    (got[3 * d + k], table.column().get(3 * id as usize + k));
                                assert_eq!(
                                    value.to_bits(),
                                    stored.to_bits(),
                                    "{dtype:?} {column:?} n {n} from {from}: DOM {d} \
                                     (sensor {id}) value {k} is {value}, the table has {stored}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn an_id_outside_the_table_panics_in_a_group_and_alone() {
        let (table, _) = table_and_ids(20, Dtype::F64, 0);
        // A whole group (8 DOMs) and a lone DOM, with a negative id and one past the end.
        for (ids, bad) in [(vec![1i16; 8], 5), (vec![1i16; 1], 0)] {
            for id in [-1i16, 20] {
                let mut ids = ids.clone();
                ids[bad] = id;
                let looked = std::panic::catch_unwind(|| {
                    looked_up(&table, IntColumn::I16(&ids), ids.len(), 0)
                });
                assert!(
                    looked.is_err(),
                    "id {id} among {} DOMs was looked up",
                    ids.len()
                );
            }
        }
    }

    /// Whether this CPU moves rows in groups.
    fn has_groups() -> bool {
        #[cfg(target_arch = "x86_64")]
        return std::arch::is_x86_feature_detected!("avx512f");
        #[cfg(not(target_arch = "x86_64"))]
        return false;
    }

    #[test]
    fn groups_write_what_one_by_one_writes() {
        if !has_groups() {
            eprintln!("skipped: this CPU has no AVX-512F, rows are never moved in groups here");
            return;
        }
        /// Checks the groups' rows against single rows; `group` DOMs a group (0: none).
        fn compare<T: Coordinate + Default>(ids: &[i64], rows: &[[T; 4]], group: usize) {
            let mut grouped = vec![[T::default(); 3]; ids.len()];
            let mut single = grouped.clone();
            let done = T::write_groups(ids, rows, &mut grouped);
            let whole = ids.len().checked_div(group).unwrap_or(0) * group;
            assert_eq!(done, whole, "whole groups of {group}");
            write_rows_one_by_one(ids, rows, &mut single);
            for (d, (g, s)) in grouped.iter().zip(&single).enumerate().take(done) {
                assert_eq!(as_bytes(g), as_bytes(s), "DOM {d} of the {done} in groups");
            }
            // Past the groups, nothing was written.
            let zero = [T::default(); 3];
            for (d, g) in grouped.iter().enumerate().skip(done) {
                assert_eq!(as_bytes(g), as_bytes(&zero), "DOM {d}, past the groups");
            }
        }
        // 1003 DOMs: 125 groups of 8 F64 rows and a tail of 3; F32 rows go one at a time.
        for dtype in [Dtype::F64, Dtype::F32] {
            let (table, ids) = table_and_ids(300, dtype, 1003);
            match table.lookup_rows() {
                LookupRows::F64(rows) => compare(&ids, rows, 8),
                LookupRows::F32(rows) => compare(&ids, rows, 0),
            }
        }
    }
}
