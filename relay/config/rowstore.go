package config

import "hash/maphash"

// rowStore keeps the table's rows as text without a pointer per row: the
// names and rows in chunks of bytes, their slots in one slice, and an
// index from the name's hash to its first slot. Only the chunks' list
// holds pointers, one a chunk: kept as a map of entries (an entry, a name
// and a text a row), 100,000 rows were objects every cycle of the
// collector marked, and the deliveries committed meanwhile waited for it
// (the latency p99 beside the rows; docs/benchmarks.md).
type rowStore struct {
	seed  maphash.Seed
	mask  uint64           // of the hash: all ones but in tests of collisions
	index map[uint64]int32 // hash of a name -> its chain's first slot
	slots []rowSlot
	free  []int32 // slots of removed rows, to be reused
	// chunks hold each used slot's name, then its row; filled in turn,
	// never grown in place (one arena grown by append was copied again
	// and again while a start read the rows, and its peak RSS showed it).
	chunks [][]byte
	size   int // bytes written in chunks
	dead   int // of size, those no used slot refers to
	used   int
}

// rowSlot is one row: chunks[chunk][pos:pos+nameLen] is its name, the
// rowLen bytes after it its text.
type rowSlot struct {
	chunk    int32
	pos      int32
	nameLen  int32
	rowLen   int32
	revision int64
	next     int32 // the next slot whose name has the same hash; -1: none
	inUse    bool
	// parsed: the row was given parsed, without text (the table's parsed
	// map holds it).
	parsed bool
}

// compactMin is the dead bytes below which removals and updates leave
// their old bytes in place.
const compactMin = 1 << 20

// chunkSize is the bytes of a chunk (a larger row has one of its own).
const chunkSize = 1 << 20

func newRowStore(capacity int) *rowStore {
	return &rowStore{seed: maphash.MakeSeed(), mask: ^uint64(0), index: make(map[uint64]int32, capacity)}
}

func (s *rowStore) hash(name string) uint64 { return maphash.String(s.seed, name) & s.mask }

// bytes are slot i's name and row.
func (s *rowStore) bytes(i int32) []byte {
	sl := &s.slots[i]
	end := int(sl.pos) + int(sl.nameLen) + int(sl.rowLen)
	return s.chunks[sl.chunk][sl.pos:end:end]
}

func (s *rowStore) name(i int32) string { return string(s.bytes(i)[:s.slots[i].nameLen]) }

// row is slot i's text. Bytes once written are never written again (a
// chunk is only appended to, compaction copies into new ones), so the
// slice stays valid after the table's lock is released.
func (s *rowStore) row(i int32) []byte { return s.bytes(i)[s.slots[i].nameLen:] }

// find is name's slot, and the slot before it in its chain (-1: it is the
// first).
func (s *rowStore) find(name string) (slot, prev int32, ok bool) {
	i, ok := s.index[s.hash(name)]
	prev = -1
	for ok && i >= 0 {
		sl := &s.slots[i]
		if int(sl.nameLen) == len(name) && string(s.bytes(i)[:sl.nameLen]) == name {
			return i, prev, true
		}
		prev, i = i, sl.next
	}
	return -1, -1, false
}

// put keeps name's row (text; nil with parsed) at revision, replacing the
// one kept.
func (s *rowStore) put(name string, text []byte, revision int64, parsed bool) {
	chunk, pos := s.write(name, text)
	if i, _, ok := s.find(name); ok {
		sl := &s.slots[i]
		s.dead += int(sl.nameLen) + int(sl.rowLen)
		sl.chunk, sl.pos, sl.nameLen, sl.rowLen, sl.revision, sl.parsed = chunk, pos, int32(len(name)), int32(len(text)), revision, parsed
		s.maybeCompact()
		return
	}
	var i int32
	if n := len(s.free); n > 0 {
		i, s.free = s.free[n-1], s.free[:n-1]
	} else {
		s.slots = append(s.slots, rowSlot{})
		i = int32(len(s.slots) - 1)
	}
	h := s.hash(name)
	next, ok := s.index[h]
	if !ok {
		next = -1
	}
	s.slots[i] = rowSlot{chunk: chunk, pos: pos, nameLen: int32(len(name)), rowLen: int32(len(text)), revision: revision, next: next, inUse: true, parsed: parsed}
	s.index[h] = i
	s.used++
}

// remove forgets name's row.
func (s *rowStore) remove(name string) {
	i, prev, ok := s.find(name)
	if !ok {
		return
	}
	sl := s.slots[i]
	switch {
	case prev >= 0:
		s.slots[prev].next = sl.next
	case sl.next >= 0:
		s.index[s.hash(name)] = sl.next
	default:
		delete(s.index, s.hash(name))
	}
	s.dead += int(sl.nameLen) + int(sl.rowLen)
	s.slots[i] = rowSlot{next: -1}
	s.free = append(s.free, i)
	s.used--
	s.maybeCompact()
}

// write appends name and text to the last chunk, or to a new one when
// they do not fit, and says where.
func (s *rowStore) write(name string, text []byte) (chunk, pos int32) {
	n := len(name) + len(text)
	last := len(s.chunks) - 1
	if last < 0 || cap(s.chunks[last])-len(s.chunks[last]) < n {
		s.chunks = append(s.chunks, make([]byte, 0, max(chunkSize, n)))
		last++
	}
	c := s.chunks[last]
	pos = int32(len(c))
	c = append(c, name...)
	s.chunks[last] = append(c, text...)
	s.size += n
	return int32(last), pos
}

// maybeCompact copies the live rows into new chunks once more of the
// bytes are dead than alive: changes cost their bytes twice at most.
func (s *rowStore) maybeCompact() {
	if s.dead < compactMin || s.dead < s.size/2 {
		return
	}
	old := *s
	s.chunks, s.size, s.dead = nil, 0, 0
	for i := range s.slots {
		sl := &s.slots[i]
		if !sl.inUse {
			continue
		}
		b := old.bytes(int32(i))
		sl.chunk, sl.pos = s.write(string(b[:sl.nameLen]), b[sl.nameLen:])
	}
}

// each calls f with every used slot.
func (s *rowStore) each(f func(i int32)) {
	for i := range s.slots {
		if s.slots[i].inUse {
			f(int32(i))
		}
	}
}
