package daemon

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/santa-offload/santa/api"
)

// journal is the append-only record of every rule-set change santad
// acknowledged, so that a new santad can rebuild the rule sets of a previous
// one. A record is a protocol message (bind, add, replace, modify, delete,
// unbind) framed as length, CRC-32C and CBOR; a torn record at the end (a
// crash mid-write) is dropped, and with it only a change that was never
// acknowledged. A bad record anywhere else is damage santad refuses to
// start on (damagedJournal).
type journal struct {
	path     string
	f        *os.File
	w        *bufio.Writer
	records  int   // since the last compaction
	appended int64 // bytes appended since the last compaction
	base     int64 // bytes the compaction wrote
	// superseding: a record since the last compaction may have made earlier
	// ones obsolete (modify, replace, delete, unbind); after only binds and
	// adds a compaction would write the journal again as it is
	superseding bool
}

// compactAt is how far a journal grows past its compacted size before
// santad compacts it while running: controllers that rewrite rules often
// (`santa http` refreshes Date every second) would otherwise fill the disk.
const compactAt = 16 << 20

// overgrown says the journal is worth compacting now. A journal that only
// grew is not: compacting it while a million rules were added cost santad a
// fifth of its time.
func (j *journal) overgrown() bool { return j.superseding && j.appended > 2*j.base+compactAt }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// damagedJournal is a journal with a bad record that more data follows: not
// a torn tail, which a crash leaves only at the end, but corruption, which
// would silently lose every change recorded after it.
type damagedJournal struct {
	path          string
	record        int    // the bad record's index
	offset        int64  // where it starts
	reason        string // what is wrong with it
	following     int64  // bytes after its start
	intactRecords int    // records after it that read intact (when its length is believable)
}

func (e *damagedJournal) Error() string {
	return fmt.Sprintf("journal %s is damaged: record %d at byte %d: %s; %d bytes follow it, %d more records read intact: "+
		"santad does not start, since it would lose the rule-set changes recorded there (the rules the last santad "+
		"left keep answering meanwhile). Keep the damaged journal for a report and move it aside "+
		"(mv %s %s.damaged); santad then starts with no rule sets, and the rules the last santad left stop "+
		"answering until their owners add them again", e.path, e.record, e.offset, e.reason, e.following, e.intactRecords,
		e.path, e.path)
}

// tornTail is where a journal's torn tail starts and how long it is.
type tornTail struct{ offset, bytes int64 }

// readJournal returns the records of the journal at path (none if it does
// not exist) and the torn tail it dropped, if any: an incomplete last
// record, or a last record that fails its checksum, which a crash in the
// middle of writing it leaves behind (its change was never acknowledged).
// A bad record that more data follows is a *damagedJournal error.
func readJournal(path string) (records []*api.Message, torn tornTail, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, tornTail{}, nil
	}
	if err != nil {
		return nil, tornTail{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, tornTail{}, err
	}
	size := st.Size()
	r := bufio.NewReaderSize(f, 1<<20)
	var off int64
	for off < size {
		damaged := func(reason string, next int64) ([]*api.Message, tornTail, error) {
			return nil, tornTail{}, &damagedJournal{path: path, record: len(records), offset: off, reason: reason,
				following: size - off, intactRecords: intactRecords(r, next, size)}
		}
		var hdr [8]byte
		if size-off < int64(len(hdr)) {
			return records, tornTail{off, size - off}, nil // torn header
		}
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, tornTail{}, fmt.Errorf("journal %s: %w", path, err)
		}
		n := binary.LittleEndian.Uint32(hdr[:4])
		end := off + int64(len(hdr)) + int64(n)
		if n == 0 || n > api.MaxFrame {
			return damaged(fmt.Sprintf("length %d, not 1 to %d", n, api.MaxFrame), -1)
		}
		if end > size {
			return records, tornTail{off, size - off}, nil // torn body
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, tornTail{}, fmt.Errorf("journal %s: %w", path, err)
		}
		if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(hdr[4:]) {
			if end == size {
				return records, tornTail{off, size - off}, nil // the last record, torn by a crash
			}
			return damaged("checksum mismatch", end)
		}
		m, err := api.Decode(body)
		if err != nil {
			return damaged(err.Error(), end)
		}
		records = append(records, m)
		off = end
	}
	return records, tornTail{}, nil
}

// intactRecords counts the records that read intact from r, which stands at
// offset next (-1: unknown) of a journal of size bytes, up to the first
// that does not: to tell an operator how much a damaged record cuts off.
func intactRecords(r *bufio.Reader, next, size int64) int {
	if next < 0 {
		return 0
	}
	n := 0
	for off := next; off < size; n++ {
		var hdr [8]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			break
		}
		length := binary.LittleEndian.Uint32(hdr[:4])
		if length == 0 || length > api.MaxFrame || off+int64(len(hdr))+int64(length) > size {
			break
		}
		body := make([]byte, length)
		if _, err := io.ReadFull(r, body); err != nil || crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(hdr[4:]) {
			break
		}
		off += int64(len(hdr)) + int64(length)
	}
	return n
}

// journalTemp names the file a compaction writes before it renames it
// over the journal (os.CreateTemp's pattern).
const journalTemp = ".journal-*"

// writeJournal atomically replaces the journal at path with records and
// returns it open for appending.
func writeJournal(path string, records []*api.Message) (*journal, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), journalTemp)
	if err != nil {
		return nil, err
	}
	j := &journal{path: path, f: tmp, w: bufio.NewWriterSize(tmp, 1<<20)}
	for _, m := range records {
		if err := j.write(m); err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			return nil, err
		}
	}
	if err := j.w.Flush(); err == nil {
		err = tmp.Sync()
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("write journal %s: %w", path, err)
	}
	j.records = 0
	j.base, j.appended = j.appended, 0
	return j, nil
}

// removeCompactionLeftovers removes the files of compactions that never
// finished next to the journal at path: santad killed while writing one
// leaves it behind (as large as the journal, in /run: memory), and no
// santad would ever remove it. Only under the state directory's lock: a
// running santad may be writing one.
func removeCompactionLeftovers(path string) (removed []string, _ error) {
	names, err := filepath.Glob(filepath.Join(filepath.Dir(path), journalTemp))
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, name := range names {
		if err := os.Remove(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

func (j *journal) write(m *api.Message) error {
	body, err := api.Encode(m)
	if err != nil {
		return err
	}
	if len(body) > api.MaxFrame { // readJournal would refuse it as damage
		return fmt.Errorf("%s record of %d bytes exceeds the %d-byte frame limit", m.Op, len(body), api.MaxFrame)
	}
	var hdr [8]byte
	binary.LittleEndian.PutUint32(hdr[:4], uint32(len(body)))
	binary.LittleEndian.PutUint32(hdr[4:], crc32.Checksum(body, castagnoli))
	if _, err := j.w.Write(hdr[:]); err != nil {
		return err
	}
	_, err = j.w.Write(body)
	j.appended += int64(len(hdr) + len(body))
	return err
}

// append records one acknowledged change. It is in the kernel's page cache
// when append returns, so it survives santad dying; santad acknowledges a
// change only after that.
func (j *journal) append(m *api.Message) error {
	size := j.base + j.appended // of the records before m
	err := j.write(m)
	if err == nil {
		err = j.w.Flush()
	}
	if err != nil {
		// the file's own name is the one the compaction wrote it under
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			err = fmt.Errorf("%s: %w", pe.Op, pe.Err)
		}
		// part of m may be on disk, and the writer keeps its error: cut the
		// file back to the records before m, so that the next record (once
		// there is room again) follows them, not a torn one
		j.appended = size - j.base
		j.w.Reset(j.f)
		if terr := j.f.Truncate(size); terr != nil {
			err = errors.Join(err, terr)
		} else if _, serr := j.f.Seek(size, io.SeekStart); serr != nil {
			err = errors.Join(err, serr)
		}
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	j.records++
	j.superseding = j.superseding || m.Op != api.OpAdd && m.Op != api.OpBind
	return nil
}

func (j *journal) close() error { return j.f.Close() }
