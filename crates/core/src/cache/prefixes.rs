//! Shared-prefix leaderboards: which prefixes many requests start with, and which carry the
//! reusable volume.
//!
//! A group is a trie node that at least two requests pass through and that no single child
//! carries on with all of them (llmtrafficlens's "maximal shared prefix"). Groups nest: a longer
//! prefix shared by fewer requests sits below a shorter one shared by more. llmtrafficlens
//! credits each group its whole depth × (count − 1), so nested groups count the outer prefix
//! again; here a group is credited only the blocks below the group it is nested in, each block
//! for every occurrence after its first. The groups' credits then add up to exactly the cold
//! ceiling's hit tokens, and shares of the total mean what they say.

use serde::{Deserialize, Serialize};

use super::Request;
use super::policy::Event;

/// How many entries each leaderboard keeps.
pub(crate) const TOP_PREFIXES: usize = 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefixGroup {
    pub prefix_blocks: u32,
    pub prefix_tokens: u64,
    /// Requests that start with this prefix.
    pub count: u64,
    /// Tokens reusable in this group's own blocks (those below the enclosing group).
    pub reusable_tokens: u64,
    pub share_of_reusable: f64,
    /// What the prefix is made of, for inputs that carry prompts.
    pub what: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Leaderboards {
    pub groups: u64,
    /// The sum over all groups: equals the cold ceiling's hit tokens.
    pub reusable_tokens: u64,
    pub by_count: Vec<PrefixGroup>,
    pub by_reusable_tokens: Vec<PrefixGroup>,
}

/// Per trie node, 16 bytes: a trace's nodes are many and each is faulted in. A node's first
/// request and depth are read, for the groups only, from its first event; the prefix's tokens
/// are summed again for the few groups shown, from that request's events.
#[derive(Debug, Clone, Copy, Default)]
struct NodeStats {
    /// The node's tokens in every occurrence after its first.
    reusable_tokens: u64,
    count: u32,
    /// The index in `events` of the node's first occurrence.
    first_event: u32,
}

/// A group's node, the tokens credited to it, and where it was first met.
#[derive(Debug, Clone, Copy)]
struct Group {
    node: usize,
    own: u64,
    count: u32,
    first_request: usize,
    /// The prefix's blocks: the node's depth in its first request.
    depth: u32,
}

/// `events` of all requests, each request's prompt at its range; `parents` from the same `EventBuilder`.
pub fn leaderboards(
    requests: &[Request],
    events: &[Event],
    request_ranges: &[std::ops::Range<usize>],
    parents: &[u32],
    top: usize,
) -> Leaderboards {
    let mut nodes = vec![NodeStats::default(); parents.len()];
    for range in request_ranges {
        for (index, event) in events[range.clone()].iter().enumerate() {
            let stats = &mut nodes[event.node() as usize];
            if stats.count == 0 {
                // Past 2^32 events (32 GiB of them) the index saturates; no input gets there.
                stats.first_event = u32::try_from(range.start + index).unwrap_or(u32::MAX);
            } else {
                stats.reusable_tokens += u64::from(event.tokens);
            }
            stats.count = stats.count.saturating_add(1);
        }
    }
    let mut carried_by_a_child = vec![false; nodes.len()];
    for node in 1..nodes.len() {
        let parent = parents[node] as usize;
        if parent != 0 && nodes[node].count == nodes[parent].count {
            carried_by_a_child[parent] = true;
        }
    }

    let mut groups = Vec::new();
    let mut total = 0u64;
    for node in 1..nodes.len() {
        let stats = nodes[node];
        if stats.count < 2 || carried_by_a_child[node] {
            continue;
        }
        let mut own = 0u64;
        let mut walk = node;
        loop {
            own += nodes[walk].reusable_tokens;
            let parent = parents[walk] as usize;
            if parent == 0 || nodes[parent].count != stats.count {
                break;
            }
            walk = parent;
        }
        total += own;
        // The request whose range holds the first event: the last to start at or before it.
        let first_event = stats.first_event as usize;
        let first_request = request_ranges
            .partition_point(|range| range.start <= first_event)
            .saturating_sub(1);
        let depth = request_ranges
            .get(first_request)
            .map_or(0, |range| first_event.saturating_sub(range.start) + 1);
        groups.push(Group {
            node,
            own,
            count: stats.count,
            first_request,
            depth: u32::try_from(depth).unwrap_or(u32::MAX),
        });
    }

    let entry = |group: &Group| {
        let representative = requests.get(group.first_request);
        let prefix_tokens = request_ranges.get(group.first_request).map_or(0, |range| {
            events[range.clone()]
                .iter()
                .take(group.depth as usize)
                .map(|e| u64::from(e.tokens))
                .sum()
        });
        PrefixGroup {
            prefix_blocks: group.depth,
            prefix_tokens,
            count: u64::from(group.count),
            reusable_tokens: group.own,
            share_of_reusable: if total == 0 {
                0.0
            } else {
                group.own as f64 / total as f64
            },
            what: representative.and_then(|r| describe(r, prefix_tokens)),
        }
    };
    let mut by_count = groups.clone();
    by_count.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then(b.depth.cmp(&a.depth))
            .then(a.node.cmp(&b.node))
    });
    let mut by_tokens = groups.clone();
    by_tokens.sort_by(|a, b| {
        b.own
            .cmp(&a.own)
            .then(b.count.cmp(&a.count))
            .then(a.node.cmp(&b.node))
    });
    Leaderboards {
        groups: groups.len() as u64,
        reusable_tokens: total,
        by_count: by_count.iter().take(top).map(entry).collect(),
        by_reusable_tokens: by_tokens.iter().take(top).map(entry).collect(),
    }
}

/// "tools (read_file, list_dir) + system \"You are…\" + user (part)": the parts of the
/// representative request's prompt that the first `tokens` cover.
fn describe(request: &Request, tokens: u64) -> Option<String> {
    const SHOWN_PARTS: usize = 4;
    if request.parts.is_empty() {
        return None;
    }
    let mut start = 0u64;
    let mut described = Vec::new();
    let mut more = 0usize;
    for part in &request.parts {
        if start >= tokens {
            break;
        }
        if described.len() == SHOWN_PARTS {
            more += 1;
            start = part.token_end;
            continue;
        }
        let mut text = part.kind.to_string();
        if let Some(label) = &part.label {
            text.push_str(&format!(" ({label})"));
        }
        if let Some(preview) = &part.preview {
            text.push_str(&format!(" {preview:?}"));
        }
        if part.token_end > tokens {
            text.push_str(" (part)");
        }
        described.push(text);
        start = part.token_end;
    }
    if more > 0 {
        described.push(format!("{more} more"));
    }
    Some(described.join(" + "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Block;
    use crate::cache::policy::EventBuilder;

    /// The leaderboards of `requests`, each a prompt from the trie's root, 20 a board.
    fn leaderboards_of(requests: &[Request]) -> Leaderboards {
        let mut builder = EventBuilder::new();
        let mut events = Vec::new();
        let mut starts = vec![0];
        for r in requests {
            builder.push(r, &mut events);
            starts.push(events.len());
        }
        let ranges: Vec<_> = starts.windows(2).map(|w| w[0]..w[1]).collect();
        leaderboards(requests, &events, &ranges, builder.parents(), 20)
    }

    #[test]
    fn nested_groups_are_not_counted_twice() {
        // Four requests share [1]; two of them share [1, 2, 3] as well.
        let paths: [&[u64]; 4] = [&[1, 2, 3, 4], &[1, 2, 3, 5], &[1, 6], &[1, 7]];
        let requests: Vec<Request> = paths
            .iter()
            .map(|ids| Request {
                blocks: ids.iter().map(|&id| Block { id, tokens: 10 }).collect(),
                ..Request::default()
            })
            .collect();
        let boards = leaderboards_of(&requests);
        assert_eq!(boards.groups, 2);
        // [1] is reused 3 times (30 tokens); [2, 3] once more each (20 tokens), not 3 × 10 + 20.
        assert_eq!(boards.reusable_tokens, 50);
        assert_eq!(boards.by_count[0].count, 4);
        assert_eq!(boards.by_count[0].reusable_tokens, 30);
        assert_eq!(boards.by_reusable_tokens[0].reusable_tokens, 30);
        assert_eq!(boards.by_count[1].prefix_tokens, 30);
        assert_eq!(boards.by_count[1].reusable_tokens, 20);
    }

    /// Empty requests between the others, and groups first met in later requests: each group's
    /// blocks and tokens are those of the request it was first met in.
    #[test]
    fn a_group_is_measured_in_the_request_it_was_first_met_in() {
        let paths: [&[u64]; 7] = [&[], &[1, 2], &[], &[3], &[1, 2, 4], &[3, 5], &[3, 5]];
        // Request i's blocks are 10 + i tokens each, so a prefix's tokens name its request.
        let requests: Vec<Request> = (0u32..)
            .zip(paths)
            .map(|(i, ids)| Request {
                blocks: ids.iter().map(|&id| Block { id, tokens: 10 + i }).collect(),
                ..Request::default()
            })
            .collect();
        let boards = leaderboards_of(&requests);
        let shown = |groups: &[PrefixGroup]| -> Vec<(u32, u64, u64, u64)> {
            groups
                .iter()
                .map(|g| (g.prefix_blocks, g.prefix_tokens, g.count, g.reusable_tokens))
                .collect()
        };
        // [3] three times from request 3; [1, 2] twice from request 1; [3, 5] twice from 5.
        assert_eq!(
            shown(&boards.by_count),
            vec![(1, 13, 3, 31), (2, 22, 2, 28), (2, 30, 2, 16)]
        );
        assert_eq!(
            shown(&boards.by_reusable_tokens),
            vec![(1, 13, 3, 31), (2, 22, 2, 28), (2, 30, 2, 16)]
        );
        assert_eq!((boards.groups, boards.reusable_tokens), (3, 75));
    }
}
