//! Where `prefixscope profile`'s time goes on a trace: read, events, next uses, each replay,
//! the leaderboards, the whole profile. Usage: profile_bench TRACE [BLOCK_SIZE]
use std::time::Instant;

use prefixscope_core::cache::leaderboards;
use prefixscope_core::cache::{Belady, Ceiling, EventBuilder, Fifo, Lru, Policy, next_uses};
use prefixscope_core::cache::{Capacity, Passes, ProfileConfig, aiperf_cache_hit_rate, profile};
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
    // The ceiling once, FIFO and optimal at the six capacities one replay each, LRU at all six
    // from one walk: the best of five runs.
    for policy in [Policy::Ceiling, Policy::Fifo, Policy::Lru, Policy::Optimal] {
        let mut best = f64::MAX;
        let mut hits = 0u64;
        for _ in 0..5 {
            let t = Instant::now();
            hits = 0;
            let each: &[usize] = match policy {
                Policy::Ceiling | Policy::Lru => &[0],
                Policy::Fifo | Policy::Optimal => &capacities,
            };
            for &capacity in each {
                let mut ceiling = Ceiling::default();
                let mut fifo = Fifo::new(capacity as u64);
                let mut optimal = Belady::new(capacity);
                let mut lru = Lru::new(&capacities.map(|c| c as u64));
                for pass in 0..replay.passes() {
                    let range = replay.starts[pass]..replay.starts[pass + 1];
                    let events = &replay.events[range.clone()];
                    let nodes = replay.parents.len();
                    hits += match policy {
                        Policy::Ceiling => ceiling.serve(nodes, events).hit_tokens,
                        Policy::Fifo => fifo.serve(nodes, events).hit_tokens,
                        Policy::Lru => lru.serve(nodes, events).iter().map(|s| s.hit_tokens).sum(),
                        Policy::Optimal => {
                            optimal
                                .serve(&replay.parents, events, &next[range])
                                .hit_tokens
                        }
                    };
                }
            }
            best = best.min(ms(t));
        }
        println!("{:<8} {:>6.1} ms (hits {hits})", policy.as_str(), best);
    }
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

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
