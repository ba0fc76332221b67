//! What the unit tests share.

/// A seeded xorshift64 generator, so a generated workload is the same on every run.
pub(crate) struct Xorshift(u64);

impl Xorshift {
    /// Any seed; an even one is made odd (zero would stay zero).
    pub(crate) fn new(seed: u64) -> Xorshift {
        Xorshift(seed | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `bound` (at least 1).
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// A reader that gives `piece` on each of its first `reads` reads, then fails ("disk gone").
/// `piece` must fit the caller's buffer: a `BufReader` of at least its length.
pub(crate) struct FailingReader {
    pub piece: &'static [u8],
    pub reads: usize,
}

impl std::io::Read for FailingReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.reads == 0 {
            return Err(std::io::Error::other("disk gone"));
        }
        self.reads -= 1;
        out[..self.piece.len()].copy_from_slice(self.piece);
        Ok(self.piece.len())
    }
}
