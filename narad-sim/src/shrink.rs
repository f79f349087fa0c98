//! Delta debugging (Zeller's ddmin) of a failing fault schedule.
//!
//! A failing run's fault schedule is data: [`ddmin`] removes events while the run still fails, down to a
//! schedule where removing any single event makes it pass (1-minimal), or until the test budget is
//! spent. The predicate runs a whole simulation, so the budget is what bounds `shrink`'s wall time.

/// Most predicate evaluations one shrink may spend by default.
pub const TESTS_MAX_DEFAULT: usize = 400;

/// Outcome of a shrink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shrunk<T> {
    /// The smallest failing input found.
    pub minimal: Vec<T>,
    /// Predicate evaluations spent.
    pub tests: usize,
    /// Whether the budget ran out before the result was 1-minimal.
    pub budget_exhausted: bool,
}

/// Shrinks `input` (which must fail) to a 1-minimal failing subsequence, keeping the order of elements.
/// `fails` answers whether a candidate still fails; it is called at most `tests_max` times.
pub fn ddmin<T: Clone>(
    input: Vec<T>,
    tests_max: usize,
    mut fails: impl FnMut(&[T]) -> bool,
) -> Shrunk<T> {
    let mut tests = 0;
    let mut test = |candidate: &[T], tests: &mut usize| -> Option<bool> {
        if *tests >= tests_max {
            return None;
        }
        *tests += 1;
        Some(fails(candidate))
    };
    let mut current = input;
    // The empty schedule first: many failures need no fault at all.
    match test(&[], &mut tests) {
        Some(true) => {
            return Shrunk {
                minimal: Vec::new(),
                tests,
                budget_exhausted: false,
            }
        }
        Some(false) => {}
        None => {
            return Shrunk {
                minimal: current,
                tests,
                budget_exhausted: true,
            }
        }
    }
    let mut granularity = 2usize;
    while current.len() >= 2 {
        let chunks = split(&current, granularity);
        let mut reduced = false;
        // Try each chunk alone, then each complement.
        for chunk in &chunks {
            let Some(failed) = test(chunk, &mut tests) else {
                return exhausted(current, tests);
            };
            if failed {
                current = chunk.clone();
                granularity = 2;
                reduced = true;
                break;
            }
        }
        if !reduced && granularity > 2 {
            for index in 0..chunks.len() {
                let complement: Vec<T> = chunks
                    .iter()
                    .enumerate()
                    .filter(|(other, _)| *other != index)
                    .flat_map(|(_, chunk)| chunk.iter().cloned())
                    .collect();
                let Some(failed) = test(&complement, &mut tests) else {
                    return exhausted(current, tests);
                };
                if failed {
                    current = complement;
                    granularity = (granularity - 1).max(2);
                    reduced = true;
                    break;
                }
            }
        }
        if reduced {
            continue;
        }
        if granularity >= current.len() {
            break;
        }
        granularity = (granularity * 2).min(current.len());
    }
    Shrunk {
        minimal: current,
        tests,
        budget_exhausted: false,
    }
}

fn exhausted<T>(current: Vec<T>, tests: usize) -> Shrunk<T> {
    Shrunk {
        minimal: current,
        tests,
        budget_exhausted: true,
    }
}

/// Splits into `parts` contiguous chunks of near-equal size (none empty when `parts <= len`).
fn split<T: Clone>(items: &[T], parts: usize) -> Vec<Vec<T>> {
    let parts = parts.min(items.len()).max(1);
    let mut chunks = Vec::with_capacity(parts);
    let mut start = 0;
    for index in 0..parts {
        let end = start + (items.len() - start) / (parts - index);
        chunks.push(items[start..end].to_vec());
        start = end;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_culprit_is_isolated() {
        let input: Vec<u32> = (0..40).collect();
        let shrunk = ddmin(input, 1000, |c| c.contains(&17));
        assert_eq!(shrunk.minimal, vec![17]);
        assert!(!shrunk.budget_exhausted);
    }

    #[test]
    fn two_interacting_events_are_both_kept_in_order() {
        let input: Vec<u32> = (0..64).collect();
        let shrunk = ddmin(input, 1000, |c| c.contains(&3) && c.contains(&50));
        assert_eq!(shrunk.minimal, vec![3, 50]);
    }

    #[test]
    fn a_failure_that_needs_no_event_shrinks_to_nothing_in_one_test() {
        let shrunk = ddmin(vec![1, 2, 3], 1000, |_| true);
        assert_eq!(shrunk.minimal, Vec::<u32>::new());
        assert_eq!(shrunk.tests, 1);
    }

    #[test]
    fn the_result_is_one_minimal() {
        // Fails when at least three multiples of 5 remain.
        let fails = |c: &[u32]| c.iter().filter(|x| *x % 5 == 0).count() >= 3;
        let shrunk = ddmin((0..30).collect(), 10_000, fails);
        assert_eq!(shrunk.minimal.len(), 3);
        for index in 0..shrunk.minimal.len() {
            let mut smaller = shrunk.minimal.clone();
            smaller.remove(index);
            assert!(!fails(&smaller));
        }
    }

    #[test]
    fn the_budget_bounds_the_tests() {
        let mut calls = 0;
        let shrunk = ddmin((0..100).collect::<Vec<u32>>(), 5, |c| {
            calls += 1;
            c.contains(&3) && c.contains(&97)
        });
        assert_eq!(calls, 5);
        assert_eq!(shrunk.tests, 5);
        assert!(shrunk.budget_exhausted);
        assert!(shrunk.minimal.contains(&3) && shrunk.minimal.contains(&97));
    }

    #[test]
    fn split_covers_everything_in_order() {
        let items: Vec<u32> = (0..10).collect();
        let chunks = split(&items, 3);
        assert_eq!(chunks, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8, 9]]);
    }
}
