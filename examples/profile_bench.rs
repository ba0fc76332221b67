//! Where `prefixscope profile`'s time goes on a trace: read, events, next uses, each replay,
//! the leaderboards, the whole profile. Usage: profile_bench TRACE [BLOCK_SIZE]
use std::time::Instant;

use prefixscope_core::cache::CapacityTotals;
use prefixscope_core::cache::fifo_sweep;
use prefixscope_core::cache::leaderboards;
use prefixscope_core::cache::{Capacity, Passes, ProfileConfig, aiperf_cache_hit_rate, profile};
use prefixscope_core::cache::{Ceiling, EventBuilder, Fifo, Policy, TrieCache, next_uses};
use prefixscope_core::cache::{all_paths_from_root, lru_stack};
use prefixscope_core::input::{self, Format, InputOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: profile_bench TRACE [BLOCK_SIZE]");
    let block_size: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(512);
    let t = Instant::now();
    let file = std::fs::File::open(path).expect("open");
    let reader = std::io::BufReader::new(file);
    let options = InputOptions {
        block_size: Some(block_size),
        ..InputOptions::default()
    };
    let requests = input::read(reader, path, Format::Mooncake, &options).requests;
    println!("read {:>8.1} ms ({} requests)", ms(t), requests.len());
    if std::env::var_os("READ_ONLY").is_some() {
        return;
    }
    let t = Instant::now();
    let mut builder = EventBuilder::new();
    let mut events = Vec::new();
    for r in &requests {
        builder.push(r, &mut events);
    }
    println!(
        "events {:>6.1} ms ({} events, {} nodes)",
        ms(t),
        events.len(),
        builder.node_count()
    );
    let t = Instant::now();
    let replay = Passes::new(&requests, false);
    println!("replay {:>6.1} ms", ms(t));
    let t = Instant::now();
    let next = next_uses(&replay.events, &replay.starts, replay.parents.len());
    println!("next uses {:>3.1} ms", ms(t));
    let capacities = [32usize, 128, 512, 2048, 8192, 32768];
    // Each policy's six replays, five times over with the caches' memory recycled as the
    // profile recycles it: the best time is the replays' own cost, without first-touch faults.
    for policy in [Policy::Ceiling, Policy::Fifo, Policy::Lru, Policy::Optimal] {
        let mut best = f64::MAX;
        let mut hits = 0u64;
        let (mut fifo, mut trie) = (Fifo::new(0), TrieCache::lru(0));
        for _ in 0..5 {
            let t = Instant::now();
            hits = 0;
            for &capacity in &capacities {
                fifo = fifo.recycle(capacity);
                trie = trie.recycle(capacity, policy);
                let mut ceiling = Ceiling::default();
                for pass in 0..replay.passes() {
                    let range = replay.starts[pass]..replay.starts[pass + 1];
                    let events = &replay.events[range.clone()];
                    hits += match policy {
                        Policy::Ceiling => ceiling.serve(replay.parents.len(), events).hit_tokens,
                        Policy::Fifo => fifo.serve(replay.parents.len(), events).hit_tokens,
                        _ => trie.serve(&replay.parents, events, &next[range]).hit_tokens,
                    };
                }
                if policy == Policy::Ceiling {
                    break;
                }
            }
            best = best.min(ms(t));
        }
        println!("{:<8} {:>6.1} ms (hits {hits})", policy.as_str(), best);
    }
    // LRU and optimal per capacity: where their six replays' time goes.
    for policy in [Policy::Lru, Policy::Optimal] {
        for &capacity in &capacities {
            let mut best = f64::MAX;
            let mut trie = TrieCache::lru(0);
            for _ in 0..5 {
                let t = Instant::now();
                trie = trie.recycle(capacity, policy);
                for pass in 0..replay.passes() {
                    let range = replay.starts[pass]..replay.starts[pass + 1];
                    trie.serve(&replay.parents, &replay.events[range.clone()], &next[range]);
                }
                best = best.min(ms(t));
            }
            println!("{} {capacity:>6} {best:>6.1} ms", policy.as_str());
        }
    }
    // FIFO and LRU at the six capacities, each from its walk (what `profile` runs).
    let all: Vec<u64> = capacities.iter().map(|&c| c as u64).collect();
    let (best, hits) = best_of_five(|| {
        fifo_sweep(
            replay.parents.len(),
            &replay.events,
            &replay.starts,
            &all,
            |_| true,
        )
        .unwrap_or_default()
    });
    println!("fifo sweep {best:>6.1} ms (hits {hits})");
    let paths = all_paths_from_root(&replay.parents, &replay.events, &replay.starts);
    let (best, hits) = best_of_five(|| {
        lru_stack(
            replay.parents.len(),
            &replay.events,
            &replay.starts,
            &all,
            |_| true,
        )
    });
    println!("lru stack {best:>6.1} ms (hits {hits}; paths from the root: {paths})");
    let t = Instant::now();
    let ranges = replay.request_ranges();
    let boards = leaderboards(&requests, &replay.events, &ranges, &replay.parents, 3);
    println!("leaderboards {:>5.1} ms ({} groups)", ms(t), boards.groups);
    let t = Instant::now();
    let rate = aiperf_cache_hit_rate(&requests);
    println!("aiperf {:>5.1} ms ({rate:?})", ms(t));
    let config = ProfileConfig {
        block_size,
        capacities: capacities
            .iter()
            .map(|&c| Capacity {
                blocks: c as u64,
                label: format!("{c}b"),
            })
            .collect(),
        prompts_only: true,
        ..ProfileConfig::default()
    };
    let t = Instant::now();
    let report = profile(&requests, &config);
    println!("profile {:>5.1} ms ({} points)", ms(t), report.points.len());
}

/// The best of five runs of a walk over every capacity, and the hits it found at all of them.
fn best_of_five(walk: impl Fn() -> Vec<CapacityTotals>) -> (f64, u64) {
    let mut best = f64::MAX;
    let mut hits = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let totals = walk();
        best = best.min(ms(t));
        hits = totals.iter().map(|t| t.hit_tokens).sum();
    }
    (best, hits)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
