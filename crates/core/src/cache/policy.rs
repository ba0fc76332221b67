//! The trie of blocks and the eviction policies, ported from kvcache-simulator 0.1.3's C++ core
//! (`kv-cache-lab-native-sim.cc`) step for step, so that every figure agrees to the token:
//!
//! - a block is a trie node `(parent node, id)`, root 0, numbered in order of first appearance;
//! - a request hits only on its contiguous cached prefix; each request looks up, then inserts;
//! - `ceiling`: every node ever seen stays cached;
//! - `fifo`: a flat queue, no trie constraint, hits do not refresh, every missing node is
//!   inserted, evicting the oldest;
//! - `lru`: a global clock bumped on every touch (hits along the prefix too); only leaves are
//!   evicted, oldest first; the nodes of the current request are protected; a node is inserted
//!   only when its parent is cached, and the rest of the request is dropped when it is not, or
//!   when nothing can be evicted (every capacity at once: [`super::lru`]);
//! - `optimal` (Belady): as `lru`, but the victim is the leaf whose next use is farthest (never =
//!   number of requests + 1), ties to the higher node; a newcomer bypasses the cache when the
//!   victim's next use is not later than its own.
//!
//! Each policy is a struct fed one request at a time, so the batch profile and the live view run
//! the same code.

use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use super::{IdMap, IdSet, Request};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    Ceiling,
    Fifo,
    Lru,
    Optimal,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Ceiling => "ceiling",
            Policy::Fifo => "fifo",
            Policy::Lru => "lru",
            Policy::Optimal => "optimal",
        }
    }

    pub fn parse(text: &str) -> Option<Policy> {
        match text.trim().to_ascii_lowercase().as_str() {
            "ceiling" => Some(Policy::Ceiling),
            "fifo" => Some(Policy::Fifo),
            "lru" => Some(Policy::Lru),
            "optimal" | "belady" => Some(Policy::Optimal),
            _ => None,
        }
    }
}

/// One block occurrence: which trie node, how many tokens, and whether this request's
/// conversation asked for that node before (the "same conversation" split). Eight bytes, the
/// flag in the node's top bit: the live view keeps every event (12 bytes each made a million
/// records' events 400 MB), and a trie has fewer than 2^31 nodes (`MAX_NODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    node_and_seen: u32,
    pub tokens: u32,
}

/// The top bit of `Event::node_and_seen`.
const SEEN: u32 = 1 << 31;
/// The last node id: past it every block would be this node. Not reached in memory: each node
/// holds more than 8 bytes in several arrays, 2^31 of them far more than any machine here has.
const MAX_NODE: u32 = SEEN - 1;

impl Event {
    pub fn new(node: u32, tokens: u32, seen_in_conversation: bool) -> Event {
        let seen = if seen_in_conversation { SEEN } else { 0 };
        Event {
            node_and_seen: node.min(MAX_NODE) | seen,
            tokens,
        }
    }

    pub fn node(&self) -> u32 {
        self.node_and_seen & MAX_NODE
    }

    pub fn seen_in_conversation(&self) -> bool {
        self.node_and_seen & SEEN != 0
    }
}

/// What one request got from one cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Served {
    pub hit_tokens: u64,
    pub same_conversation_tokens: u64,
    pub hit_blocks: u32,
}

impl Served {
    pub(super) fn hit(&mut self, event: &Event) {
        self.hit_tokens += u64::from(event.tokens);
        self.hit_blocks += 1;
        if event.seen_in_conversation() {
            self.same_conversation_tokens += u64::from(event.tokens);
        }
    }

    pub(super) fn add(&mut self, other: Served) {
        self.hit_tokens += other.hit_tokens;
        self.same_conversation_tokens += other.same_conversation_tokens;
        self.hit_blocks += other.hit_blocks;
    }
}

/// Turns requests into events: interns trie nodes `(parent, id)` and remembers which
/// conversation asked for which node. Grows with the number of distinct nodes.
#[derive(Debug, Default)]
pub struct EventBuilder {
    /// `parent[node]`; node 0 is the root.
    parent: Vec<u32>,
    /// The first node made for each small id, indexed by the id (0: none yet; see
    /// [`super::small_id_slot`]): a trace id names one block after one prefix.
    first_by_id: Vec<u32>,
    /// Every other `(parent, id)`: a small id met under a second parent, any large id.
    edges: IdMap<(u32, u64), u32>,
    conversation_names: std::collections::HashMap<String, u32>,
    /// Per node, the first conversation that asked for it (`NO_CONVERSATION`: none yet). Most
    /// nodes are asked for by one conversation only, so this array answers "seen by this
    /// conversation before" for them without a hash set.
    first_conversation: Vec<u32>,
    /// The other `(conversation, node)` pairs seen: a node asked for by a second conversation.
    seen_by_other_conversations: IdSet<(u32, u32)>,
}

/// `EventBuilder::first_conversation` of a node no conversation asked for yet.
const NO_CONVERSATION: u32 = u32::MAX;

impl EventBuilder {
    pub fn new() -> EventBuilder {
        EventBuilder {
            parent: vec![0],
            ..EventBuilder::default()
        }
    }

    pub fn parents(&self) -> &[u32] {
        &self.parent
    }

    /// The parents, without a copy, once every request is in.
    pub fn into_parents(self) -> Vec<u32> {
        self.parent
    }

    /// Room for about `blocks` more distinct nodes.
    pub fn reserve(&mut self, blocks: usize) {
        self.parent.reserve(blocks);
        self.first_conversation.reserve(blocks);
    }

    /// The node of block `id` after node `parent`, made (numbered next) when new.
    fn node_of(&mut self, parent: u32, id: u64) -> u32 {
        let next = u32::try_from(self.parent.len()).map_or(MAX_NODE, |n| n.min(MAX_NODE));
        let Some(slot) = super::small_id_slot(id, self.first_by_id.len(), self.parent.len()) else {
            return self.edge(parent, id, next);
        };
        if slot >= self.first_by_id.len() {
            self.first_by_id.resize(slot + 1, 0);
        }
        match self.first_by_id[slot] {
            // Not made here yet; it may have been made in `edges` while its id was too large.
            0 => {
                let node = self.edge_if_known(parent, id).unwrap_or_else(|| {
                    self.parent.push(parent);
                    next
                });
                self.first_by_id[slot] = node;
                node
            }
            first if self.parent[first as usize] == parent => first,
            _ => self.edge(parent, id, next),
        }
    }

    fn edge_if_known(&self, parent: u32, id: u64) -> Option<u32> {
        if self.edges.is_empty() {
            return None;
        }
        self.edges.get(&(parent, id)).copied()
    }

    fn edge(&mut self, parent: u32, id: u64, next: u32) -> u32 {
        let node = *self.edges.entry((parent, id)).or_insert(next);
        if node == next {
            self.parent.push(parent);
        }
        node
    }

    /// Nodes including the root.
    pub fn node_count(&self) -> usize {
        self.parent.len()
    }

    /// Appends the request's events to `out`.
    pub fn push(&mut self, request: &Request, out: &mut Vec<Event>) {
        self.push_blocks(&request.blocks, request.conversation.as_deref(), out);
    }

    /// Appends the events of `blocks` (a request's prompt, or what it leaves cached) asked for
    /// by `conversation`.
    pub fn push_blocks(
        &mut self,
        blocks: &[super::Block],
        conversation: Option<&str>,
        out: &mut Vec<Event>,
    ) {
        let conversation = conversation.map(|name| {
            // Below `NO_CONVERSATION`; past 2^32 - 2 names (never in memory) they share one.
            let next = u32::try_from(self.conversation_names.len())
                .map_or(NO_CONVERSATION - 1, |n| n.min(NO_CONVERSATION - 1));
            match self.conversation_names.get(name) {
                Some(&known) => known,
                None => {
                    self.conversation_names.insert(name.to_string(), next);
                    next
                }
            }
        });
        let mut parent = 0u32;
        for block in blocks {
            let node = self.node_of(parent, block.id);
            // A node occurs at most once per request (its depth is its position), so testing and
            // inserting in one pass equals "seen in an earlier request of this conversation".
            let seen_in_conversation = conversation.is_some_and(|c| self.seen_before(c, node));
            out.push(Event::new(node, block.tokens, seen_in_conversation));
            parent = node;
        }
    }

    /// Whether `conversation` asked for `node` before, and from now on it has: the node's
    /// first conversation has, and any other is in the set.
    fn seen_before(&mut self, conversation: u32, node: u32) -> bool {
        let index = node as usize;
        grow(&mut self.first_conversation, index + 1, NO_CONVERSATION);
        match self.first_conversation[index] {
            NO_CONVERSATION => {
                self.first_conversation[index] = conversation;
                false
            }
            first if first == conversation => true,
            _ => !self
                .seen_by_other_conversations
                .insert((conversation, node)),
        }
    }
}

fn grow<T: Clone>(vector: &mut Vec<T>, len: usize, fill: T) {
    if vector.len() < len {
        vector.resize(len, fill);
    }
}

/// `ceiling`: no capacity, nothing evicted.
#[derive(Debug, Clone, Default)]
pub struct Ceiling {
    seen: Vec<bool>,
}

impl Ceiling {
    pub fn serve(&mut self, node_count: usize, events: &[Event]) -> Served {
        grow(&mut self.seen, node_count, false);
        let mut served = Served::default();
        for event in events {
            if !self.seen[event.node() as usize] {
                break;
            }
            served.hit(event);
        }
        for event in events {
            self.seen[event.node() as usize] = true;
        }
        served
    }

    pub fn cached_blocks(&self) -> usize {
        self.seen.iter().skip(1).filter(|&&seen| seen).count()
    }
}

/// `fifo`: every missing node is inserted and the oldest insertion evicted; hits do not
/// refresh. After T insertions the cache holds exactly the nodes of the last min(T, C) (a node
/// evicted by the insertion C after its own cannot be that insertion, so the last C insertions
/// are C distinct nodes): a node is cached while its latest insertion's number s satisfies
/// s + C > T. So each node keeps that number, and there is no queue.
#[derive(Debug, Clone)]
pub struct Fifo {
    capacity: u64,
    /// Per node, the number (from 1) of its latest insertion, 0 for none. 32 bits: an insertion
    /// is an event, and 2^32 events held in memory would take 32 GiB.
    stamps: Vec<u32>,
    insertions: u64,
    requests: u64,
    full_since: Option<u64>,
}

impl Fifo {
    pub fn new(capacity: u64) -> Fifo {
        Fifo {
            capacity,
            stamps: Vec::new(),
            insertions: 0,
            requests: 0,
            full_since: None,
        }
    }

    /// Index of the request during which the cache first filled up.
    pub fn full_since(&self) -> Option<u64> {
        self.full_since
    }

    pub fn serve(&mut self, node_count: usize, events: &[Event]) -> Served {
        let request = self.requests;
        self.requests += 1;
        grow(&mut self.stamps, node_count, 0);
        let mut served = Served::default();
        // The hits are the contiguous cached prefix: no insertion happens before the first miss.
        let mut hitting = true;
        for event in events {
            let Some(stamp) = self.stamps.get_mut(event.node() as usize) else {
                continue;
            };
            // A stamp is at most the insertions: no sum to overflow at a capacity near u64::MAX.
            if *stamp != 0 && self.insertions - u64::from(*stamp) < self.capacity {
                if hitting {
                    served.hit(event);
                }
                continue;
            }
            hitting = false;
            self.insertions += 1;
            *stamp = u32::try_from(self.insertions).unwrap_or(u32::MAX);
            if self.insertions == self.capacity {
                self.full_since = Some(request);
            }
        }
        served
    }
}

/// FIFO or LRU at several capacities, fed one pass at a time: what the profile and the live
/// view both run (LRU's walk serves every capacity at once; FIFO runs one cache each).
#[derive(Debug, Clone)]
pub(crate) enum EveryCapacity {
    Fifo(Vec<Fifo>, Vec<Served>),
    Lru(super::lru::Lru),
}

impl EveryCapacity {
    /// `Policy::Lru` walks LRU; any other policy, FIFO.
    pub(crate) fn new(policy: Policy, capacities: &[u64]) -> EveryCapacity {
        match policy {
            Policy::Lru => EveryCapacity::Lru(super::lru::Lru::new(capacities)),
            _ => EveryCapacity::Fifo(
                capacities.iter().map(|&c| Fifo::new(c)).collect(),
                Vec::with_capacity(capacities.len()),
            ),
        }
    }

    /// What each capacity, in the order given, served of this pass.
    pub(crate) fn serve(&mut self, node_count: usize, events: &[Event]) -> &[Served] {
        match self {
            EveryCapacity::Lru(lru) => lru.serve(node_count, events),
            EveryCapacity::Fifo(fifos, served) => {
                served.clear();
                served.extend(fifos.iter_mut().map(|f| f.serve(node_count, events)));
                served
            }
        }
    }

    /// The pass during which each capacity first filled up.
    pub(crate) fn full_since(&self) -> Vec<Option<u64>> {
        match self {
            EveryCapacity::Lru(lru) => lru.full_since(),
            EveryCapacity::Fifo(fifos, _) => fifos.iter().map(Fifo::full_since).collect(),
        }
    }
}

/// A heap entry, ordered by the node's next use, then by node (the reference's comparator:
/// ties go to the higher node). It is current while its node is a cached leaf with that next
/// use: a node's next use only grows (it is later than the request that sets it), so an entry
/// left from an earlier stay in the cache never matches again. Two current entries of one node
/// are equal, and either picks the same victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Leaf {
    next_use: u32,
    node: u32,
}

impl Ord for Leaf {
    /// As one number: the heap compares once instead of twice.
    fn cmp(&self, other: &Leaf) -> std::cmp::Ordering {
        let order = |leaf: &Leaf| (u64::from(leaf.next_use) << 32) | u64::from(leaf.node);
        order(self).cmp(&order(other))
    }
}

impl PartialOrd for Leaf {
    fn partial_cmp(&self, other: &Leaf) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The top bit of [`NodeState::mark`]: the node is cached.
const PRESENT: u32 = 1 << 31;

/// What the optimal cache knows about one node, in 12 bytes, so that one access fetches it all.
#[derive(Debug, Clone, Copy, Default)]
struct NodeState {
    /// The next request that uses the node (a request index, as `next_uses` gives it).
    next_use: u32,
    child_count: u32,
    /// The request mark that protects the node (below `PRESENT`), and `PRESENT`.
    mark: u32,
}

impl NodeState {
    fn present(&self) -> bool {
        self.mark & PRESENT != 0
    }

    fn set_present(&mut self, present: bool) {
        self.mark = if present {
            self.mark | PRESENT
        } else {
            self.mark & !PRESENT
        };
    }

    fn protected_by(&self, mark: u32) -> bool {
        self.mark & !PRESENT == mark
    }

    fn protect(&mut self, mark: u32) {
        self.mark = (self.mark & PRESENT) | mark;
    }
}

/// `optimal` (Belady): a trie whose leaves are evicted farthest next use first, from a lazily
/// updated heap.
#[derive(Debug, Clone)]
pub struct Belady {
    capacity: usize,
    nodes: Vec<NodeState>,
    mark: u32,
    heap: BinaryHeap<Leaf>,
    size: usize,
    requests: u64,
    full_since: Option<u64>,
    /// Protected leaves popped during this request's evictions. The reference pushes them back
    /// after every eviction and pops them again at the next; they stay protected until the
    /// request ends, so keeping them aside until then picks the same victims.
    skipped: Vec<Leaf>,
}

impl Belady {
    pub fn new(capacity: usize) -> Belady {
        Belady::with_buffers(capacity, Vec::new(), Vec::new())
    }

    /// An empty cache that reuses this one's memory: a batch of replays then writes into pages
    /// already faulted in instead of new ones for each.
    pub fn recycle(self, capacity: usize) -> Belady {
        Belady::with_buffers(capacity, self.nodes, self.heap.into_vec())
    }

    fn with_buffers(capacity: usize, mut nodes: Vec<NodeState>, mut heap: Vec<Leaf>) -> Belady {
        nodes.clear();
        nodes.push(NodeState {
            mark: PRESENT,
            ..NodeState::default()
        });
        heap.clear();
        Belady {
            capacity,
            nodes,
            mark: 1,
            heap: BinaryHeap::from(heap),
            size: 0,
            requests: 0,
            full_since: None,
            skipped: Vec::new(),
        }
    }

    pub fn full_since(&self) -> Option<u64> {
        self.full_since
    }

    pub fn cached_blocks(&self) -> usize {
        self.size
    }

    /// Queues `node` as an eviction candidate if it is a cached leaf.
    fn push_if_leaf(&mut self, node: u32) {
        let state = &self.nodes[node as usize];
        if node != 0 && state.present() && state.child_count == 0 {
            self.heap.push(Leaf {
                next_use: state.next_use,
                node,
            });
        }
    }

    fn is_current(&self, leaf: &Leaf) -> bool {
        let state = &self.nodes[leaf.node as usize];
        state.present() && state.child_count == 0 && state.next_use == leaf.next_use
    }

    /// Evicts the leaf used farthest ahead, unless a newcomer next used at `newcomer` is used
    /// no earlier (it then bypasses the cache). False when nothing was evicted. `newest`, the
    /// leaf this request inserted last, waits outside the heap: the next insertion makes it an
    /// inner node, and most heap entries were such leaves going stale.
    fn evict_leaf(&mut self, parents: &[u32], newcomer: u32, newest: &mut Option<Leaf>) -> bool {
        loop {
            let top = self.heap.peek().copied();
            let victim = match (top, *newest) {
                // Inserted by this request after its hits: current and unprotected.
                (_, Some(leaf)) if top.is_none_or(|top| leaf > top) => {
                    if leaf.next_use <= newcomer {
                        return false;
                    }
                    *newest = None;
                    leaf
                }
                (Some(top), _) => {
                    if !self.is_current(&top) {
                        self.heap.pop();
                        continue;
                    }
                    if self.nodes[top.node as usize].protected_by(self.mark) {
                        self.heap.pop();
                        self.skipped.push(top);
                        continue;
                    }
                    // A newcomer used no later than the victim bypasses the cache; the victim
                    // stays where it is (the reference pops it and pushes it back: the same
                    // order).
                    if top.next_use <= newcomer {
                        return false;
                    }
                    self.heap.pop();
                    top
                }
                (None, _) => return false,
            };
            let n = victim.node as usize;
            self.nodes[n].set_present(false);
            self.size -= 1;
            let parent = parents[n];
            self.nodes[parent as usize].child_count -= 1;
            self.push_if_leaf(parent);
            return true;
        }
    }

    /// Stale entries pile up as leaves are touched; dropping them when they outnumber the live
    /// ones keeps the heap proportional to the cache without changing which leaf pops next
    /// (current entries are totally ordered).
    fn compact(&mut self) {
        if self.heap.len() > 2 * self.size + 1024 {
            let mut entries = std::mem::take(&mut self.heap).into_vec();
            entries.retain(|leaf| self.is_current(leaf));
            self.heap = BinaryHeap::from(entries);
        }
    }

    /// Serves one request. `next_use[i]` is the index of the next request that contains
    /// `events[i]`'s node (or the number of requests + 1).
    pub fn serve(&mut self, parents: &[u32], events: &[Event], next_use: &[u32]) -> Served {
        let request = self.requests;
        self.requests += 1;
        let mut served = Served::default();
        if self.capacity == 0 {
            return served;
        }
        grow(&mut self.nodes, parents.len(), NodeState::default());
        let next = |i: usize| next_use.get(i).copied().unwrap_or(0);

        self.mark += 1;
        if self.mark == PRESENT - 1 {
            self.nodes.iter_mut().for_each(|state| state.protect(0));
            self.mark = 1;
        }
        self.nodes[0].protect(self.mark);
        // A request's events are a path from the root, and a node is cached only while its
        // parent is (one is inserted under a cached parent, only leaves are evicted): the cached
        // nodes of the path are its prefix, the hits. The reference protects every cached node
        // of the request; here those are the hits, and the insertions begin after them.
        let mut hits = 0;
        for (i, event) in events.iter().enumerate() {
            let state = &mut self.nodes[event.node() as usize];
            if !state.present() {
                break;
            }
            state.protect(self.mark);
            state.next_use = next(i);
            served.hit(event);
            self.push_if_leaf(event.node());
            hits += 1;
        }

        let mut newest = None;
        for (i, event) in events.iter().enumerate().skip(hits) {
            let n = event.node() as usize;
            // Past the hits nothing is cached, but for ids folded into the last node at the
            // node cap (`MAX_NODE`, not reached in memory): there, this keeps the counts right.
            if self.nodes[n].present() {
                continue;
            }
            if self.size >= self.capacity && !self.evict_leaf(parents, next(i), &mut newest) {
                break;
            }
            let parent = parents[n] as usize;
            if self.size < self.capacity && self.nodes[parent].present() {
                self.nodes[n].set_present(true);
                self.nodes[n].next_use = next(i);
                self.size += 1;
                self.nodes[parent].child_count += 1;
                // The newest before is this node's parent, an inner node now.
                newest = Some(Leaf {
                    next_use: next(i),
                    node: event.node(),
                });
                if self.size >= self.capacity && self.full_since.is_none() {
                    self.full_since = Some(request);
                }
            } else {
                break;
            }
        }
        self.heap.extend(newest);
        self.heap.extend(self.skipped.drain(..));
        self.compact();
        served
    }
}

/// The most nodes optimal must hold at once to miss nothing the ceiling hits: over the passes,
/// the nodes seen so far that a later pass uses again, plus the pass's own nodes seen before
/// that no later pass uses (its hits, which it protects). `next_use` is [`next_uses`]'s.
///
/// At a capacity of at least this, optimal hits exactly what the ceiling hits. By induction over
/// the passes: every node seen before a pass and used by it is cached when it starts (so its
/// hits are the ceiling's), and only nodes no later pass uses are ever evicted or bypassed.
/// When a pass inserts a node a later pass uses, its ancestors on the path are used then too,
/// so fewer than the capacity of the cached nodes are still needed or its protected hits, and
/// a cached node no later pass uses is left: the deepest such is a leaf, not on the path,
/// unprotected, and its key is "never", which no node used again reaches, so the victim is
/// one of those (the newcomer's key is not "never": no bypass). A newcomer no later pass uses
/// is bypassed when the cache is full (nothing is farther than "never"), and so is the rest of
/// its path, which no later pass uses either. Until the cache is full nothing is evicted.
pub(crate) fn optimal_working_set(events: &[Event], starts: &[usize], next_use: &[u32]) -> u64 {
    let passes = starts.len().saturating_sub(1);
    let mut seen: Vec<bool> = Vec::new();
    // `ending[p]`: nodes whose wait for their next use ends at pass p.
    let mut ending = vec![0u64; passes + 1];
    let (mut waiting, mut most) = (0u64, 0u64);
    for pass in 0..passes {
        let range = starts[pass]..starts[pass + 1];
        waiting -= ending[pass];
        let mut protected_dead = 0;
        for i in range.clone() {
            let node = events[i].node() as usize;
            grow(&mut seen, node + 1, false);
            match next_use.get(i).map(|&n| n as usize) {
                Some(next) if next > pass && next < passes => {
                    waiting += 1;
                    ending[next] += 1;
                }
                _ if seen[node] => protected_dead += 1,
                _ => {}
            }
        }
        for i in range {
            seen[events[i].node() as usize] = true;
        }
        most = most.max(waiting + protected_dead);
    }
    most
}

/// For each event of `events` (requests delimited by `starts`), the index of the next request
/// containing the same node, or `requests + 1` when there is none (the reference's "never").
pub fn next_uses(events: &[Event], starts: &[usize], node_count: usize) -> Vec<u32> {
    let requests = starts.len().saturating_sub(1);
    let never = u32::try_from(requests + 1).unwrap_or(u32::MAX);
    let mut next = vec![never; events.len()];
    let mut last_use = vec![never; node_count];
    for request in (0..requests).rev() {
        let range = starts[request]..starts[request + 1];
        for i in range.clone() {
            next[i] = last_use[events[i].node() as usize];
        }
        for i in range {
            last_use[events[i].node() as usize] = u32::try_from(request).unwrap_or(u32::MAX);
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_eight_bytes_and_gives_back_what_it_was_given() {
        assert_eq!(std::mem::size_of::<Event>(), 8);
        for (node, tokens, seen) in [(0, 0, false), (7, 32, true), (MAX_NODE, u32::MAX, true)] {
            let event = Event::new(node, tokens, seen);
            assert_eq!(
                (event.node(), event.tokens, event.seen_in_conversation()),
                (node, tokens, seen)
            );
        }
        // Past the last node id (not reached in memory) the node is the last, the flag kept.
        let past = Event::new(u32::MAX, 1, false);
        assert_eq!(
            (past.node(), past.seen_in_conversation()),
            (MAX_NODE, false)
        );
    }
    use crate::cache::Block;

    fn request(ids: &[u64]) -> Request {
        Request {
            blocks: ids.iter().map(|&id| Block { id, tokens: 1 }).collect(),
            ..Request::default()
        }
    }

    fn events_of(builder: &mut EventBuilder, ids: &[u64]) -> Vec<Event> {
        let mut out = Vec::new();
        builder.push(&request(ids), &mut out);
        out
    }

    #[test]
    fn seen_in_conversation_is_what_a_set_of_pairs_says() {
        // Conversations interleave over shared and own prefixes; each flag must be "this
        // conversation asked for this node before", as a set of every (conversation, node)
        // pair answers it.
        let mut rng = crate::test_support::Xorshift::new(0x9e37_79b9_7f4a_7c15u64);
        let mut next = move |bound: u64| rng.below(bound);
        let mut builder = EventBuilder::new();
        let mut pairs = std::collections::HashSet::new();
        let mut flagged = 0;
        for _ in 0..3_000 {
            let conversation = match next(6) {
                0 => None,
                c => Some(format!("c{c}")),
            };
            let len = 1 + next(8);
            let ids: Vec<u64> = (0..len).map(|_| next(12)).collect();
            let mut events = Vec::new();
            builder.push(
                &Request {
                    conversation: conversation.clone(),
                    ..request(&ids)
                },
                &mut events,
            );
            for event in events {
                let expected = conversation
                    .as_ref()
                    .is_some_and(|c| !pairs.insert((c.clone(), event.node())));
                assert_eq!(event.seen_in_conversation(), expected);
                flagged += usize::from(expected);
            }
        }
        assert!(flagged > 1_000, "{flagged}");
    }

    #[test]
    fn trie_nodes_depend_on_the_parent() {
        let mut b = EventBuilder::new();
        let a = events_of(&mut b, &[7, 8]);
        let c = events_of(&mut b, &[8, 7]);
        let d = events_of(&mut b, &[7, 9]);
        assert_eq!(a.iter().map(|e| e.node()).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(c.iter().map(|e| e.node()).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(d.iter().map(|e| e.node()).collect::<Vec<_>>(), vec![1, 5]);
        assert_eq!(b.parents(), &[0, 0, 1, 0, 3, 1]);
    }

    /// The array of first nodes by id numbers nodes exactly as one map of `(parent, id)`
    /// would: ids met under several parents, ids first too large for the array and later
    /// within it, ids past `usize` on 32-bit targets alike.
    #[test]
    fn nodes_are_numbered_as_one_map_of_parent_and_id_would() {
        let mut builder = EventBuilder::new();
        let mut naive: std::collections::HashMap<(u32, u64), u32> = Default::default();
        let mut naive_parents = vec![0u32];
        let mut rng = crate::test_support::Xorshift::new(0x2545_f491_4f6c_dd1du64);
        let mut random = move || rng.next();
        for request in 0..4_000u64 {
            let len = 1 + (random() % 6) as usize;
            let ids: Vec<u64> = (0..len)
                .map(|_| match random() % 4 {
                    0 => 9_000 + random() % 8,    // large at first, small later
                    1 => random() % 64,           // met under many parents
                    2 => 100_000 + request,       // always large: the map
                    _ => u64::MAX - random() % 4, // past any array
                })
                .collect();
            let events = events_of(&mut builder, &ids);
            let mut parent = 0u32;
            for (event, &id) in events.iter().zip(&ids) {
                let next = naive_parents.len() as u32;
                let node = *naive.entry((parent, id)).or_insert(next);
                if node == next {
                    naive_parents.push(parent);
                }
                assert_eq!(event.node(), node, "request {request}, id {id}");
                parent = node;
            }
        }
        assert_eq!(builder.parents(), &naive_parents[..]);
        assert!(
            builder.first_by_id.len() > 9_000,
            "the array grew past the ids met first in the map"
        );
    }

    #[test]
    fn ceiling_counts_only_the_contiguous_prefix() {
        let mut b = EventBuilder::new();
        let mut ceiling = Ceiling::default();
        let first = events_of(&mut b, &[1, 2, 3]);
        assert_eq!(ceiling.serve(b.node_count(), &first).hit_tokens, 0);
        let second = events_of(&mut b, &[1, 9, 3]);
        // Node (9→3) differs from (2→3): only block 1 is a hit.
        assert_eq!(ceiling.serve(b.node_count(), &second).hit_tokens, 1);
        let third = events_of(&mut b, &[1, 2, 3, 4]);
        assert_eq!(ceiling.serve(b.node_count(), &third).hit_tokens, 3);
    }

    #[test]
    fn fifo_does_not_refresh_on_hits() {
        let mut b = EventBuilder::new();
        let mut fifo = Fifo::new(2);
        for ids in [&[1u64][..], &[2], &[1], &[3], &[1]] {
            let events = events_of(&mut b, ids);
            let served = fifo.serve(b.node_count(), &events);
            if ids == [1] && fifo.requests == 3 {
                assert_eq!(served.hit_tokens, 1);
            }
            if ids == [1] && fifo.requests == 5 {
                // 3 pushed out 1 although 1 was hit after 2 arrived.
                assert_eq!(served.hit_tokens, 0);
            }
        }
        assert_eq!(fifo.full_since(), Some(1));
    }

    /// The stamps serve what a plain queue of insertions serves, pass by pass, at capacities
    /// from none to more than all, on generated tries.
    #[test]
    fn fifo_equals_a_queue_of_insertions() {
        for seed in 1..20u64 {
            let (parents, events, starts) = crate::cache::lru::tests::generated(seed, 300);
            for capacity in [0u64, 1, 2, 5, 13, 60, 5000] {
                let mut fifo = Fifo::new(capacity);
                let mut queue = std::collections::VecDeque::new();
                let mut cached = vec![false; parents.len()];
                for (pass, bounds) in starts.windows(2).enumerate() {
                    let path = &events[bounds[0]..bounds[1]];
                    let mut expected = Served::default();
                    for event in path.iter().take_while(|e| cached[e.node() as usize]) {
                        expected.hit(event);
                    }
                    for event in path {
                        let node = event.node() as usize;
                        if capacity == 0 || cached[node] {
                            continue;
                        }
                        if queue.len() as u64 == capacity {
                            let oldest: usize = queue.pop_front().unwrap_or_default();
                            cached[oldest] = false;
                        }
                        queue.push_back(node);
                        cached[node] = true;
                    }
                    let served = fifo.serve(parents.len(), path);
                    assert_eq!(
                        served, expected,
                        "seed {seed}, capacity {capacity}, pass {pass}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_node_state_is_twelve_bytes_and_the_mark_keeps_the_cached_flag() {
        assert_eq!(std::mem::size_of::<NodeState>(), 12);
        assert_eq!(std::mem::size_of::<Leaf>(), 8);
        let mut state = NodeState::default();
        state.set_present(true);
        state.protect(PRESENT - 2);
        assert!(state.present() && state.protected_by(PRESENT - 2));
        state.protect(0);
        assert!(state.present() && !state.protected_by(PRESENT - 2));
        state.set_present(false);
        state.protect(5);
        assert!(!state.present() && state.protected_by(5));
    }

    /// One pass a request, with each event's next use.
    fn passes(sequence: &[&[u64]]) -> (EventBuilder, Vec<Event>, Vec<usize>, Vec<u32>) {
        let mut b = EventBuilder::new();
        let mut events = Vec::new();
        let mut starts = vec![0];
        for ids in sequence {
            b.push(&request(ids), &mut events);
            starts.push(events.len());
        }
        let next = next_uses(&events, &starts, b.node_count());
        (b, events, starts, next)
    }

    /// The request marks wrap round without losing which nodes are cached: a cache whose mark is
    /// about to wrap serves a sequence as a fresh one does.
    #[test]
    fn the_mark_wraps_round_without_changing_what_is_served() {
        let sequence: [&[u64]; 8] = [
            &[1, 2, 3],
            &[1, 2, 4],
            &[1, 5],
            &[1, 2, 3],
            &[6, 7],
            &[1, 2, 4],
            &[1, 5],
            &[6, 7, 8],
        ];
        let (b, events, starts, next) = passes(&sequence);
        let serve_all = |cache: &mut Belady| {
            starts
                .windows(2)
                .map(|pass| {
                    let range = pass[0]..pass[1];
                    (
                        cache
                            .serve(b.parents(), &events[range.clone()], &next[range])
                            .hit_tokens,
                        cache.cached_blocks(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let fresh = serve_all(&mut Belady::new(4));
        let mut wrapping = Belady::new(4);
        wrapping.mark = PRESENT - 4;
        assert_eq!(serve_all(&mut wrapping), fresh);
        assert!(wrapping.mark < 8, "the mark wrapped");
    }

    #[test]
    fn optimal_keeps_what_is_used_next() {
        let sequence: [&[u64]; 5] = [&[1], &[2], &[3], &[1], &[2]];
        let (b, events, starts, next) = passes(&sequence);
        let mut optimal = Belady::new(2);
        let mut hits = Vec::new();
        for r in 0..sequence.len() {
            let range = starts[r]..starts[r + 1];
            hits.push(
                optimal
                    .serve(b.parents(), &events[range.clone()], &next[range])
                    .hit_tokens,
            );
        }
        // 3 is never used again, so it bypasses the cache and both 1 and 2 hit.
        assert_eq!(hits, vec![0, 0, 0, 1, 1]);
    }

    /// At every capacity from the working set, optimal hits what the ceiling hits, request by
    /// request; below it, it may not (the bound is sufficient, and close: the generated tries
    /// lose hits a few blocks below it).
    #[test]
    fn optimal_from_its_working_set_hits_what_the_ceiling_hits() {
        let mut below_lost = 0;
        for seed in 1..40u64 {
            let (parents, events, starts) = crate::cache::lru::tests::generated(seed, 300);
            let next = next_uses(&events, &starts, parents.len());
            let working_set = optimal_working_set(&events, &starts, &next) as usize;
            let mut ceiling = Ceiling::default();
            let ceiling_hits: Vec<Served> = (0..starts.len() - 1)
                .map(|p| ceiling.serve(parents.len(), &events[starts[p]..starts[p + 1]]))
                .collect();
            for capacity in [working_set.saturating_sub(3), working_set, working_set + 40] {
                let mut optimal = Belady::new(capacity);
                let hits: Vec<Served> = (0..starts.len() - 1)
                    .map(|p| {
                        let range = starts[p]..starts[p + 1];
                        optimal.serve(&parents, &events[range.clone()], &next[range])
                    })
                    .collect();
                if capacity >= working_set {
                    assert_eq!(hits, ceiling_hits, "seed {seed}, capacity {capacity}");
                } else if hits != ceiling_hits {
                    below_lost += 1;
                }
            }
        }
        assert!(below_lost > 0);
    }
}
