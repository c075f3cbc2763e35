//! The one way latency sketches are made: an HDR histogram (2 significant digits, u32 counts)
//! whose unit and range are named with it, so that a value is never read in another unit.
use hdrhistogram::Histogram;

/// A sketch's unit and range.
#[derive(Clone, Copy, Debug)]
pub struct SketchUnit {
    /// Nanoseconds per recorded unit.
    pub unit_ns: u64,
    /// Highest value held, in units; longer calls count as this.
    pub max_units: u64,
}

/// Sketches of the aggregate: 100 ns units up to 100 s (driver calls take microseconds and up),
/// about 12 KB each.
pub const AGGREGATE: SketchUnit = SketchUnit {
    unit_ns: 100,
    max_units: 1_000_000_000,
};
/// The detector's launch-latency sketch: 10 ns units up to 10 s.
pub const LAUNCH: SketchUnit = SketchUnit {
    unit_ns: 10,
    max_units: 1_000_000_000,
};

impl SketchUnit {
    /// An empty sketch in this unit.
    pub fn sketch(self) -> Histogram<u32> {
        Histogram::new_with_bounds(1, self.max_units, 2)
            .expect("1 <= max_units and 2 significant digits are valid bounds")
    }

    /// A duration in this unit, within the sketch's range.
    pub fn units(self, ns: u64) -> u64 {
        ns.div_ceil(self.unit_ns).clamp(1, self.max_units)
    }

    /// A recorded value back in nanoseconds.
    pub fn ns(self, units: u64) -> u64 {
        units.saturating_mul(self.unit_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_round_up_and_clamp() {
        assert_eq!(
            (AGGREGATE.units(1), AGGREGATE.units(250), AGGREGATE.ns(3)),
            (1, 3, 300)
        );
        assert_eq!(LAUNCH.units(u64::MAX), LAUNCH.max_units);
        let mut h = LAUNCH.sketch();
        h.record(LAUNCH.units(4_000)).unwrap();
        // Two significant digits: a value reads back within 1%.
        let v = LAUNCH.ns(h.value_at_quantile(0.5));
        assert!((3_960..=4_040).contains(&v), "{v}");
    }
}
