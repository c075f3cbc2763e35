//! Dropping past a bound without one tenant evicting another's: one at a time, the entry of
//! the tenant holding the most that was seen longest ago goes first.
use std::collections::HashMap;

/// Of `entries` (tenant, when last seen, key), the `n` to drop: each time the longest unseen
/// of the tenant with the most entries left (of tenants holding as many, the one whose longest
/// unseen is older).
pub fn longest_unseen_of_largest<T, K>(
    entries: impl Iterator<Item = (T, f64, K)>,
    n: usize,
) -> Vec<K>
where
    T: std::hash::Hash + Eq,
{
    let mut by_tenant: HashMap<T, Vec<(f64, K)>> = HashMap::new();
    for (tenant, seen, key) in entries {
        by_tenant.entry(tenant).or_default().push((seen, key));
    }
    // Newest first: the longest unseen is popped from the end.
    for list in by_tenant.values_mut() {
        list.sort_by(|a, b| b.0.total_cmp(&a.0));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let oldest = |l: &Vec<(f64, K)>| l.last().map_or(f64::INFINITY, |e| e.0);
        let Some(list) = by_tenant
            .values_mut()
            .filter(|l| !l.is_empty())
            .max_by(|a, b| {
                a.len()
                    .cmp(&b.len())
                    .then_with(|| oldest(b).total_cmp(&oldest(a)))
            })
        else {
            break;
        };
        if let Some((_, k)) = list.pop() {
            out.push(k);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_largest_tenant_loses_its_oldest_first() {
        let entries = [
            ("a", 1.0, 1),
            ("b", 2.0, 2),
            ("b", 3.0, 3),
            ("b", 4.0, 4),
            ("a", 5.0, 5),
        ];
        // b holds three: its oldest goes first, not a's older one; then both hold two, and the
        // older of their oldest goes (whatever order the tenants are held in).
        for _ in 0..20 {
            let gone = super::longest_unseen_of_largest(entries.into_iter(), 2);
            assert_eq!(gone, vec![2, 1]);
        }
    }
}
