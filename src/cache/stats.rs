//! Small exact statistics: a correctly rounded float sum and the percentiles the reports print.

use serde::{Deserialize, Serialize};

/// The correctly rounded sum of `values` (Shewchuk's algorithm, as Python's `math.fsum`): the
/// reference figures were computed that way, and a naive sum differs in the 15th digit.
pub fn exact_sum(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut partials: Vec<f64> = Vec::new();
    for value in values {
        let mut x = value;
        let mut kept = 0;
        for j in 0..partials.len() {
            let mut y = partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                partials[kept] = lo;
                kept += 1;
            }
            x = hi;
        }
        partials.truncate(kept);
        partials.push(x);
    }
    let mut n = partials.len();
    if n == 0 {
        return 0.0;
    }
    n -= 1;
    let mut hi = partials[n];
    let mut lo = 0.0;
    while n > 0 {
        let x = hi;
        n -= 1;
        let y = partials[n];
        hi = x + y;
        let rounded = hi - x;
        lo = y - rounded;
        if lo != 0.0 {
            break;
        }
    }
    // Round half to even on the remaining partials, as fsum does.
    if n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0)) {
        let y = lo * 2.0;
        let x = hi + y;
        if y == x - hi {
            hi = x;
        }
    }
    hi
}

/// p50, p90, p99 and mean of a list of counts.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Distribution {
    pub n: u64,
    pub p50: Option<u64>,
    pub p90: Option<u64>,
    pub p99: Option<u64>,
    pub mean: Option<f64>,
}

/// Percentiles by linear interpolation between closest ranks (Python's
/// `statistics.quantiles(method="inclusive")`, numpy's default), rounded half to even, so they
/// read like llmtrafficlens's.
pub fn distribution(values: &mut [u64]) -> Distribution {
    if values.is_empty() {
        return Distribution::default();
    }
    values.sort_unstable();
    let n = values.len() as u64;
    let percentile = |p: u64| -> u64 {
        if values.len() == 1 {
            return values[0];
        }
        let scaled = u128::from(p) * u128::from(n - 1);
        let j = (scaled / 100) as usize;
        let delta = scaled % 100;
        let below = u128::from(values[j]);
        let above = u128::from(values[(j + 1).min(values.len() - 1)]);
        let numerator = below * (100 - delta) + above * delta;
        let (quotient, remainder) = (numerator / 100, numerator % 100);
        let rounded = match (2 * remainder).cmp(&100) {
            std::cmp::Ordering::Greater => quotient + 1,
            std::cmp::Ordering::Equal => quotient + (quotient % 2),
            std::cmp::Ordering::Less => quotient,
        };
        u64::try_from(rounded).unwrap_or(u64::MAX)
    };
    let total: u128 = values.iter().map(|&v| u128::from(v)).sum();
    Distribution {
        n,
        p50: Some(percentile(50)),
        p90: Some(percentile(90)),
        p99: Some(percentile(99)),
        mean: Some(total as f64 / n as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_sum_is_correctly_rounded() {
        assert_eq!(exact_sum([0.1; 10]), 1.0);
        assert_eq!(exact_sum([1e100, 1.0, -1e100, 1e-100]), 1.0);
        assert_eq!(exact_sum([]), 0.0);
        let naive: f64 = [0.1; 10].iter().sum();
        assert_ne!(naive, 1.0);
    }

    #[test]
    fn percentiles_interpolate_and_round_half_to_even() {
        let d = distribution(&mut [1, 2, 3, 4]);
        // p50 at rank 1.5: 2.5 rounds to 2; p90 at 2.7: 3.7 → 4; p99 at 2.97 → 3.97 → 4.
        assert_eq!((d.p50, d.p90, d.p99), (Some(2), Some(4), Some(4)));
        assert_eq!(distribution(&mut [7]).p99, Some(7));
        assert_eq!(distribution(&mut []).n, 0);
    }
}
