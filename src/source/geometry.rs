//! `sensor_geometry.csv`: the position of every DOM (sensor), keyed by `sensor_id`.

use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

/// Sensor positions, indexed densely by `sensor_id` (ids need not be contiguous).
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    /// The CSV file it was read from.
    pub path: PathBuf,
    /// `x[id]`, `y[id]`, `z[id]` in metres; meaningful only where `present[id]`.
    pub x: Vec<f64>,
    /// See `x`.
    pub y: Vec<f64>,
    /// See `x`.
    pub z: Vec<f64>,
    /// Whether the id appears in the file.
    pub present: Vec<bool>,
    /// The number of sensors listed.
    pub count: usize,
}

/// Sensor ids above this are rejected: the table is dense and ids are int16 in the schema.
const MAX_SENSOR_ID: i64 = 1 << 20;

/// A header field as a column name: trimmed, and without the double quotes around it that
/// R's `write.csv` writes (a quote on one side only is kept).
fn column_name(field: &str) -> &str {
    let field = field.trim();
    field
        .strip_prefix('"')
        .and_then(|name| name.strip_suffix('"'))
        .unwrap_or(field)
}

impl Geometry {
    /// Reads `sensor_id,x,y,z` (columns in any order, extra columns ignored).
    pub fn read(path: &Path) -> Result<Geometry> {
        let text = std::fs::read_to_string(path).at(path)?;
        Self::parse(path, &text)
    }

    /// Parses the CSV text; `path` is only used in error messages. A byte-order mark (as
    /// Excel and `to_csv(encoding="utf-8-sig")` write one), CRLF line ends and quoted
    /// column names (as R's `write.csv` writes them) are accepted.
    pub fn parse(path: &Path, text: &str) -> Result<Geometry> {
        let err = |line: usize, problem: String| Error::Geometry {
            path: path.to_path_buf(),
            line,
            problem,
        };
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines = text.lines().enumerate();
        let (_, header) = lines
            .next()
            .ok_or_else(|| err(1, "empty file, expected header sensor_id,x,y,z".into()))?;
        let names: Vec<&str> = header.split(',').map(column_name).collect();
        let find = |name: &str| {
            names.iter().position(|n| *n == name).ok_or_else(|| {
                err(
                    1,
                    format!("header lacks column `{name}` (found {header:?})"),
                )
            })
        };
        let cols = [find("sensor_id")?, find("x")?, find("y")?, find("z")?];
        let mut geometry = Geometry {
            path: path.to_path_buf(),
            x: Vec::new(),
            y: Vec::new(),
            z: Vec::new(),
            present: Vec::new(),
            count: 0,
        };
        for (index, line) in lines {
            let line_no = index + 1;
            if line.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let field = |c: usize| {
                fields.get(c).copied().ok_or_else(|| {
                    err(
                        line_no,
                        format!("expected {} fields, found {}", names.len(), fields.len()),
                    )
                })
            };
            let id: i64 = field(cols[0])?.parse().map_err(|_| {
                err(
                    line_no,
                    format!("sensor_id {:?} is not an integer", fields[cols[0]]),
                )
            })?;
            if !(0..=MAX_SENSOR_ID).contains(&id) {
                return Err(err(
                    line_no,
                    format!("sensor_id {id} out of range 0..={MAX_SENSOR_ID}"),
                ));
            }
            let mut xyz = [0.0f64; 3];
            for (k, name) in ["x", "y", "z"].iter().enumerate() {
                let raw = field(cols[k + 1])?;
                let v: f64 = raw
                    .parse()
                    .map_err(|_| err(line_no, format!("{name} {raw:?} is not a number")))?;
                if !v.is_finite() {
                    return Err(err(line_no, format!("{name} is {raw}, not finite")));
                }
                xyz[k] = v;
            }
            let id = id as usize;
            if id >= geometry.present.len() {
                let n = id + 1;
                geometry.x.resize(n, 0.0);
                geometry.y.resize(n, 0.0);
                geometry.z.resize(n, 0.0);
                geometry.present.resize(n, false);
            }
            if geometry.present[id] {
                return Err(err(line_no, format!("sensor_id {id} listed twice")));
            }
            geometry.present[id] = true;
            geometry.x[id] = xyz[0];
            geometry.y[id] = xyz[1];
            geometry.z[id] = xyz[2];
            geometry.count += 1;
        }
        if geometry.count == 0 {
            return Err(err(1, "no sensors listed".into()));
        }
        Ok(geometry)
    }

    /// Whether `sensor_id` is listed.
    pub fn contains(&self, sensor_id: i64) -> bool {
        usize::try_from(sensor_id)
            .ok()
            .and_then(|i| self.present.get(i).copied())
            .unwrap_or(false)
    }

    /// The largest listed sensor id.
    pub fn max_sensor_id(&self) -> usize {
        self.present.iter().rposition(|&p| p).unwrap_or(0)
    }

    /// x, y, z of every id up to the largest, row by row; NaN rows for unlisted ids.
    pub fn positions(&self) -> Vec<f64> {
        (0..self.present.len())
            .flat_map(|id| match self.present[id] {
                true => [self.x[id], self.y[id], self.z[id]],
                false => [f64::NAN; 3],
            })
            .collect()
    }

    /// Whether every coordinate survives a round trip through `f32` exactly.
    pub fn fits_f32(&self) -> bool {
        [&self.x, &self.y, &self.z]
            .iter()
            .all(|col| col.iter().all(|&v| (v as f32) as f64 == v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_columns_in_any_order() {
        let g = Geometry::parse(
            Path::new("g.csv"),
            "z,sensor_id,x,y\n3.5,2,1.0,2.0\n-1,0,4,5\n",
        )
        .unwrap();
        assert_eq!(g.count, 2);
        assert!(g.contains(0) && g.contains(2) && !g.contains(1) && !g.contains(-1));
        assert_eq!((g.x[2], g.y[2], g.z[2]), (1.0, 2.0, 3.5));
        assert!(g.fits_f32());
    }

    /// What spreadsheet and R exports add: a byte-order mark, CRLF line ends, quoted column
    /// names and R's unnamed column of row names.
    #[test]
    fn a_bom_crlf_and_quoted_names_read_as_the_plain_file() {
        let parse = |text: &str| Geometry::parse(Path::new("g.csv"), text);
        let plain = parse("sensor_id,x,y,z\n0,1,2,3\n1,4,5,6\n").unwrap();
        for exported in [
            "\u{feff}sensor_id,x,y,z\n0,1,2,3\n1,4,5,6\n",
            "sensor_id,x,y,z\r\n0,1,2,3\r\n1,4,5,6\r\n",
            "\"\",\"sensor_id\",\"x\",\"y\",\"z\"\n\"1\",0,1,2,3\n\"2\",1,4,5,6\n",
        ] {
            let g = parse(exported).unwrap_or_else(|e| panic!("{exported:?}: {e}"));
            assert_eq!(
                (g.count, &g.x, &g.y, &g.z, &g.present),
                (2, &plain.x, &plain.y, &plain.z, &plain.present),
                "{exported:?}"
            );
        }
        // A quote on one side only is part of the name.
        let e = parse("\"sensor_id,x,y,z\n0,1,2,3\n").unwrap_err();
        assert!(
            e.to_string().contains("header lacks column `sensor_id`"),
            "{e}"
        );
    }

    #[test]
    fn names_the_bad_line() {
        let e = Geometry::parse(Path::new("g.csv"), "sensor_id,x,y,z\n0,1,2,3\n1,1,oops,3\n")
            .unwrap_err();
        assert_eq!(e.to_string(), "g.csv: line 3: y \"oops\" is not a number");
        let e =
            Geometry::parse(Path::new("g.csv"), "sensor_id,x,y,z\n0,1,2,3\n0,1,2,3\n").unwrap_err();
        assert_eq!(e.to_string(), "g.csv: line 3: sensor_id 0 listed twice");
    }

    #[test]
    fn decimal_coordinates_do_not_fit_f32() {
        let g = Geometry::parse(
            Path::new("g.csv"),
            "sensor_id,x,y,z\n0,-256.14,-521.08,496.03\n",
        )
        .unwrap();
        assert!(!g.fits_f32());
    }
}
