package daemon

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/santa-offload/santa/api"
)

// journal is the append-only record of every rule-set change santad
// acknowledged, so that a new santad can rebuild the rule sets of a previous
// one. A record is a protocol message (bind, add, replace, modify, delete,
// unbind) framed as length, CRC-32C and CBOR; a torn record at the end (a
// crash mid-write) is dropped, and with it only a change that was never
// acknowledged.
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

// readJournal returns the records of the journal at path (none if it does
// not exist).
func readJournal(path string) ([]*api.Message, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var out []*api.Message
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return out, nil
			}
			return nil, fmt.Errorf("journal %s: %w", path, err)
		}
		n := binary.LittleEndian.Uint32(hdr[:4])
		if n == 0 || n > api.MaxFrame {
			return out, nil // torn header
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return out, nil // torn body
		}
		if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(hdr[4:]) {
			return out, nil
		}
		m, err := api.Decode(body)
		if err != nil {
			return nil, fmt.Errorf("journal %s: record %d: %w", path, len(out), err)
		}
		out = append(out, m)
	}
}

// writeJournal atomically replaces the journal at path with records and
// returns it open for appending.
func writeJournal(path string, records []*api.Message) (*journal, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".journal-*")
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

func (j *journal) write(m *api.Message) error {
	body, err := api.Encode(m)
	if err != nil {
		return err
	}
	if len(body) > api.MaxFrame { // readJournal would take it for a torn tail and drop all after it
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
	if err := j.write(m); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := j.w.Flush(); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.records++
	j.superseding = j.superseding || m.Op != api.OpAdd && m.Op != api.OpBind
	return nil
}

func (j *journal) close() error { return j.f.Close() }
