//! Small exact statistics: a correctly rounded float sum and the percentiles the reports print.

use serde::{Deserialize, Serialize};

/// The correctly rounded sum of `values` (Shewchuk's algorithm, as Python's `math.fsum`): the
/// reference figures were computed that way, and a naive sum differs in the 15th digit.
pub(crate) fn exact_sum(values: impl IntoIterator<Item = f64>) -> f64 {
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
pub(crate) fn distribution(values: &mut [u64]) -> Distribution {
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

/// The mean of `values`, each in [0, 1], as Python's `statistics.mean` computes it: the exact
/// sum divided by the count, rounded once (AIPerf's `cache_hit_rate` is that mean of per-request
/// ratios). Summing first and dividing after rounds twice and can be one unit in the last place
/// off. The exact sum is kept as an integer count of 2^-96 (every ratio k/m with m < 2^44 is a
/// whole number of them); a value that is not falls back to the correctly rounded sum.
pub(crate) fn mean_of_unit_values(values: &[f64]) -> Option<f64> {
    const SCALE_BITS: i32 = 96;
    if values.is_empty() {
        return None;
    }
    let count = values.len() as u128;
    let fallback = || exact_sum(values.iter().copied()) / values.len() as f64;
    // Each value as a whole number of 2^-96; the sum of fewer than 2^31 of them fits in u128.
    if count >= 1 << 31 {
        return Some(fallback());
    }
    let mut sum: u128 = 0;
    for &value in values {
        if !(0.0..=1.0).contains(&value) {
            return Some(fallback());
        }
        if value == 0.0 {
            continue;
        }
        let bits = value.to_bits();
        let exponent = ((bits >> 52) & 0x7ff) as i32;
        let mantissa = if exponent == 0 {
            bits & ((1 << 52) - 1)
        } else {
            (bits & ((1 << 52) - 1)) | (1 << 52)
        };
        // value = mantissa × 2^(exponent − 1075) (subnormals: exponent 1).
        let power = exponent.max(1) - 1075 + SCALE_BITS;
        if power < 0 {
            return Some(fallback());
        }
        sum += u128::from(mantissa) << power;
    }
    if sum == 0 {
        return Some(0.0);
    }
    // sum / count with at least 55 significant bits, then rounded to 53, half to even.
    let mut quotient = sum / count;
    let mut remainder = sum % count;
    let mut extra = 0;
    while 128 - quotient.leading_zeros() < 55 {
        // remainder < count < 2^31, so one more bit at a time never overflows.
        remainder <<= 1;
        quotient = (quotient << 1) | (remainder / count);
        remainder %= count;
        extra += 1;
    }
    let width = 128 - quotient.leading_zeros();
    let shift = width - 53;
    let mut mantissa = quotient >> shift;
    let dropped = quotient & ((1u128 << shift) - 1);
    let half = 1u128 << (shift - 1);
    if dropped > half || (dropped == half && (remainder != 0 || mantissa & 1 == 1)) {
        mantissa += 1;
    }
    let exponent = shift as i32 - SCALE_BITS - extra;
    Some(mantissa as f64 * 2f64.powi(exponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_is_rounded_once_as_statistics_mean() {
        assert_eq!(mean_of_unit_values(&[]), None);
        assert_eq!(mean_of_unit_values(&[0.0, 0.0]), Some(0.0));
        assert_eq!(mean_of_unit_values(&[1.0, 0.0]), Some(0.5));
        assert_eq!(mean_of_unit_values(&[0.1; 10]), Some(0.1));
        assert_eq!(mean_of_unit_values(&[1.0 / 3.0; 3]), Some(1.0 / 3.0));
        assert_eq!(mean_of_unit_values(&[0.1, 0.2, 0.3]), Some(0.2));
        // Python's statistics.mean of these is 0.6525373923653592; math.fsum(...) / 6, which
        // rounds twice, is 0.6525373923653593.
        let ratios = [39.0 / 47.0, 1.0, 25.0 / 31.0, 1.0 / 3.0, 0.25, 16.0 / 23.0];
        assert_eq!(mean_of_unit_values(&ratios), Some(0.652_537_392_365_359_2));
        assert_eq!(exact_sum(ratios) / 6.0, 0.652_537_392_365_359_3);
    }

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
