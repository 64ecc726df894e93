//! Latency tables as the RAMSIS generator wants them: one latency per batch
//! size `1..=B`, filled and made monotone the way the authors' code does it
//! (DESIGN.md, "Notes on the reference implementations"), plus Pareto pruning
//! (§4.3.3) and the synthetic model family of §7.3.2.

/// Ordinary least squares `y = a + b·x`; returns `(a, b)`. With fewer than two
/// distinct `x` the slope is 0.
pub fn linear_fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.is_empty() {
        return (0.0, 0.0);
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - slope * mx, slope)
}

/// Builds a latency table for batch sizes `1..=max_batch` from measured
/// `(batch, latency)` points, as the artifact's `profile_utils.py` does:
/// sizes that were not measured get the value of a least-squares line fitted
/// to the measured ones, and then, scanning from the largest size down, any
/// latency larger than the next size's is lowered to it (non-decreasing in
/// batch size).
pub fn fill_table(measured: &[(u32, f64)], max_batch: u32) -> Vec<f64> {
    let points: Vec<(f64, f64)> = measured.iter().map(|&(b, l)| (f64::from(b), l)).collect();
    let (a, slope) = linear_fit(&points);
    let mut table: Vec<f64> = (1..=max_batch).map(|b| a + slope * f64::from(b)).collect();
    for &(b, l) in measured {
        if (1..=max_batch).contains(&b) {
            table[(b - 1) as usize] = l;
        }
    }
    make_monotone(&mut table);
    table
}

/// The artifact's monotone fix: from the largest batch size down, lower each
/// latency that exceeds the next size's latency to it.
pub fn make_monotone(table: &mut [f64]) {
    for i in (1..table.len()).rev() {
        if table[i] < table[i - 1] {
            table[i - 1] = table[i];
        }
    }
}

/// The latency at `batch` of a table, extrapolated by a least-squares line over
/// the whole table when `batch` is beyond it (the artifact's
/// `InfLatencySampler`, used for the full-queue state's batch `N_w + 1`).
pub fn extrapolate(table: &[f64], batch: usize) -> f64 {
    if let Some(&l) = batch.checked_sub(1).and_then(|i| table.get(i)) {
        return l;
    }
    let points: Vec<(f64, f64)> =
        table.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| ((i + 1) as f64, l)).collect();
    let (a, b) = linear_fit(&points);
    a + b * batch as f64
}

/// Indices of the models on the accuracy–latency Pareto front (§4.3.3), in
/// increasing order of batch-1 latency: a model is kept when it is strictly
/// more accurate than every faster kept model. Ties in latency keep the more
/// accurate model. Models without a batch-1 latency are dropped.
pub fn pareto_front(accuracy: &[f64], batch1_latency: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..accuracy.len()).filter(|&i| batch1_latency[i].is_finite()).collect();
    order.sort_by(|&a, &b| batch1_latency[a].total_cmp(&batch1_latency[b]).then(accuracy[b].total_cmp(&accuracy[a])));
    let mut front = Vec::new();
    let mut best = f64::NEG_INFINITY;
    for i in order {
        if accuracy[i] > best {
            best = accuracy[i];
            front.push(i);
        }
    }
    front
}

/// The synthetic model family of §7.3.2: the Pareto models, plus, between
/// each two adjacent ones, models every `step` of accuracy (0.005 in the
/// paper) above the lower one, with each batch size's latency linearly
/// interpolated in accuracy between the two. Returns `(accuracy, table)`
/// pairs sorted by accuracy; the originals are kept exactly (a strict superset).
pub fn interpolate_front(models: &[(f64, Vec<f64>)], step: f64) -> Vec<(f64, Vec<f64>)> {
    let mut sorted: Vec<&(f64, Vec<f64>)> = models.iter().collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, Vec<f64>)> = Vec::new();
    for pair in sorted.windows(2) {
        let (lo, hi) = (pair[0], pair[1]);
        out.push(lo.clone());
        // Offsets lo + i·step, i ≥ 1, strictly below the next Pareto model: for
        // the 9 image models of the artifact this gives the paper's M = 60.
        let mut i = 1;
        loop {
            let acc = lo.0 + step * f64::from(i);
            if acc >= hi.0 - 1e-9 {
                break;
            }
            let f = (acc - lo.0) / (hi.0 - lo.0);
            let table = lo.1.iter().zip(&hi.1).map(|(a, b)| a + f * (b - a)).collect();
            out.push((acc, table));
            i += 1;
        }
    }
    if let Some(last) = sorted.last() {
        out.push((*last).clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_uses_regression_then_monotone_fix() {
        let t = fill_table(&[(1, 10.0), (2, 20.0), (4, 35.0)], 5);
        // Line through the points: 10 + 8.214·(b-1)… missing 3 and 5 come from it.
        assert_eq!(t[0], 10.0);
        assert_eq!(t[1], 20.0);
        assert_eq!(t[3], 35.0);
        assert!(t[2] > 20.0 && t[2] <= 35.0);
        assert!(t[4] >= t[3]);
        let mut m = vec![1.0, 5.0, 3.0, 4.0];
        make_monotone(&mut m);
        assert_eq!(m, vec![1.0, 3.0, 3.0, 4.0]);
    }

    #[test]
    fn pareto_front_keeps_strict_improvements() {
        let acc = [0.6, 0.7, 0.65, 0.8, 0.75];
        let lat = [10.0, 20.0, 25.0, 30.0, 40.0];
        assert_eq!(pareto_front(&acc, &lat), vec![0, 1, 3]);
    }

    #[test]
    fn interpolation_is_a_superset_on_a_grid() {
        let models = vec![(0.6, vec![10.0, 20.0]), (0.62, vec![20.0, 40.0])];
        let out = interpolate_front(&models, 0.005);
        let accs: Vec<f64> = out.iter().map(|m| m.0).collect();
        assert_eq!(accs.len(), 5, "{accs:?}");
        assert!((out[2].0 - 0.61).abs() < 1e-12);
        assert!((out[2].1[0] - 15.0).abs() < 1e-9);
        assert_eq!(out[4].1, vec![20.0, 40.0]);
    }
}
