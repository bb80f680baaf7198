// Package crashjournal is a node's record of the in-process native calls in
// flight, durable across a crash of the node: a file of fixed slots mapped
// shared into the process (MAP_SHARED), where each call writes its worker
// and event before it enters native code and clears them when it returns.
// The kernel keeps what a process wrote to a shared mapping when the
// process dies (a segfault, an abort, SIGKILL), so the next start finds the
// calls that were in flight when the node died.
//
// At Open the journal counts, in a small JSON file beside it (written
// atomically), how many crashes each worker and each (worker, event) was in
// flight at: an event seen at EventCrashes crashes is a suspect (Suspect: the
// node dead-letters it as `crashed` instead of running it again), and a
// worker seen at Quarantine crashes is reported for quarantine. A node that
// stops normally marks the journal clean (Close), so a call left running in
// native code at a normal stop is not taken for a crash.
//
// A call costs two stores into the mapping and one atomic flag each way (no
// system call, no allocation): see BenchmarkEnterLeave.
package crashjournal

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// File names inside the journal's directory.
const (
	JournalFile = "crash-journal"
	CountsFile  = "crash-counts.json"
	// CrashOutputFile receives the Go runtime's crash report (a fatal
	// signal, an unrecovered panic) with Options.CrashOutput.
	CrashOutputFile = "crash-output"
)

// Defaults of Options.
const (
	DefaultSlots        = 4096
	DefaultEventCrashes = 2
	DefaultQuarantine   = 2
	// MaxEvents bounds the (worker, event) counts kept; the oldest go first.
	MaxEvents = 1024
	// MaxSlots bounds Options.Slots (1 MiB of mapping per 4096 slots).
	MaxSlots = 1 << 20
)

// Layout: a header slot, then the call slots, SlotSize bytes each.
const (
	SlotSize      = 256
	magic         = "WMCJv1\x00\x00"
	offSlots      = 8  // header: uint32 slot count
	offClean      = 12 // header: uint32, 1 when the node stopped normally
	offPID        = 16 // header: uint32, the pid of the node that has it
	offState      = 0  // slot: uint32, 1 while a call is in flight
	offWorkerLen  = 4
	offEventLen   = 5
	offSourceHash = 8
	offWorker     = 16
	maxWorker     = 112
	offEvent      = 128
	maxEvent      = 128
)

// Options configure Open; zero fields take the defaults.
type Options struct {
	// Slots is how many calls can be journaled at once (each in-process
	// call slot of a loaded worker holds one). Default DefaultSlots.
	Slots int
	// EventCrashes: a (worker, event) in flight at this many crashes is a
	// suspect. Default DefaultEventCrashes.
	EventCrashes int
	// Quarantine: a worker in flight at this many crashes is reported for
	// quarantine. Default DefaultQuarantine.
	Quarantine int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// CrashOutput makes the process's crash report (runtime/debug's
	// SetCrashOutput: a fatal signal such as a segfault in native code, an
	// unrecovered panic) go to CrashOutputFile too, and counts only the
	// deaths that wrote one: a process killed from outside (SIGKILL, the
	// OOM killer) with calls in flight is reported (Report.Killed) but
	// not counted against its workers. Without it every death with calls
	// in flight counts. One journal per process may set it.
	CrashOutput bool
}

// Call is one call the journal found in flight at a crash.
type Call struct {
	Worker string `json:"worker"`
	// Event is the event's id, or "sha256:<hex>" of it when longer than
	// the slot holds.
	Event      string `json:"event"`
	SourceHash uint64 `json:"source_hash"`
}

// WorkerCount is a worker's crash count.
type WorkerCount struct {
	Crashes   int       `json:"crashes"`
	LastEvent string    `json:"last_event,omitempty"`
	LastAt    time.Time `json:"last_at"`
}

// EventCount is a (worker, event)'s crash count.
type EventCount struct {
	Call
	Crashes int       `json:"crashes"`
	LastAt  time.Time `json:"last_at"`
}

// Counts is the durable file beside the journal.
type Counts struct {
	Workers map[string]WorkerCount `json:"workers"`
	Events  []EventCount           `json:"events"`
}

// Report is what Open found.
type Report struct {
	// Crashed: the node before this one died without stopping normally
	// while calls were in flight (InFlight), counted.
	Crashed  bool
	InFlight []Call
	// Killed: it died with calls in flight (InFlight) but wrote no crash
	// report (Options.CrashOutput): killed from outside, not counted.
	Killed bool
	// CrashReport is the first line of its crash report (CrashOutput).
	CrashReport string
	// Quarantine lists the workers whose crash count reached
	// Options.Quarantine (until Quarantined resets them).
	Quarantine map[string]WorkerCount
	// Suspects lists the (worker, event)s at EventCrashes crashes or more.
	Suspects []EventCount
}

// Slot is a place for one call; -1 is none.
type Slot int

type key struct {
	worker, event string
	source        uint64
}

// Journal is an open journal. A nil *Journal journals nothing and suspects
// nothing.
type Journal struct {
	dir  string
	opts Options
	f    *os.File
	mem  []byte
	// crashOut is CrashOutputFile while it is the crash output.
	crashOut *os.File

	freeMu sync.Mutex
	free   []int

	mu       sync.Mutex // counts and the file beside
	counts   Counts
	suspects atomic.Pointer[map[key]struct{}]
}

// Open maps the journal in dir (created when missing), reads the calls a
// crash left in it, counts them into the counts file, clears the slots and
// returns what it found. Two processes cannot have one journal (an
// exclusive lock on the file): give each node its own directory.
func Open(dir string, o Options) (*Journal, Report, error) {
	if o.Slots == 0 {
		o.Slots = DefaultSlots
	}
	if o.Slots < 1 || o.Slots > MaxSlots {
		return nil, Report{}, fmt.Errorf("crash journal: %d slots is out of range 1..%d", o.Slots, MaxSlots)
	}
	if o.EventCrashes <= 0 {
		o.EventCrashes = DefaultEventCrashes
	}
	if o.Quarantine <= 0 {
		o.Quarantine = DefaultQuarantine
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, Report{}, fmt.Errorf("crash journal: create its directory (NODE_STATE_DIR): %w", err)
	}
	j := &Journal{dir: dir, opts: o}
	var rep Report
	var err error
	if rep.InFlight, rep.Crashed, err = j.mapFile(); err != nil {
		return nil, Report{}, err
	}
	counts, err := readCounts(filepath.Join(dir, CountsFile))
	if err != nil {
		j.unmap()
		return nil, Report{}, err
	}
	j.counts = counts
	if o.CrashOutput {
		if rep.CrashReport, err = j.takeCrashOutput(); err != nil {
			j.unmap()
			return nil, Report{}, err
		}
		if rep.Crashed && rep.CrashReport == "" {
			rep.Crashed, rep.Killed = false, true
		}
	}
	if rep.Crashed {
		j.count(rep.InFlight)
		if err := j.saveLocked(); err != nil {
			j.unmap()
			return nil, Report{}, err
		}
	}
	// The calls are counted: start with empty slots, not stopped normally.
	clear(j.mem[SlotSize:])
	binary.LittleEndian.PutUint32(j.mem[offClean:], 0)
	binary.LittleEndian.PutUint32(j.mem[offPID:], uint32(os.Getpid()))
	j.free = make([]int, 0, o.Slots)
	for i := o.Slots; i >= 1; i-- {
		j.free = append(j.free, i)
	}
	j.refreshSuspects()
	rep.Quarantine = map[string]WorkerCount{}
	for w, c := range j.counts.Workers {
		if c.Crashes >= o.Quarantine {
			rep.Quarantine[w] = c
		}
	}
	for _, e := range j.counts.Events {
		if e.Crashes >= o.EventCrashes {
			rep.Suspects = append(rep.Suspects, e)
		}
	}
	return j, rep, nil
}

// count adds one crash to every worker and (worker, event) of calls. A
// worker's LastEvent is, of its calls in this crash, the event in flight
// at the most crashes so far (the likeliest cause; the first in slot order
// among equals): a worker with several events in flight names the one
// that keeps crashing, not whichever took the first slot.
func (j *Journal) count(calls []Call) {
	now := j.opts.Now().UTC()
	if j.counts.Workers == nil {
		j.counts.Workers = map[string]WorkerCount{}
	}
	type culprit struct {
		event   string
		crashes int
	}
	worst := map[string]culprit{}
	var workers []string
	for _, c := range calls {
		n := 1
		found := false
		for i := range j.counts.Events {
			if j.counts.Events[i].Call == c {
				j.counts.Events[i].Crashes++
				j.counts.Events[i].LastAt = now
				n = j.counts.Events[i].Crashes
				found = true
				break
			}
		}
		if !found {
			j.counts.Events = append(j.counts.Events, EventCount{Call: c, Crashes: 1, LastAt: now})
		}
		if w, ok := worst[c.Worker]; !ok || n > w.crashes {
			if !ok {
				workers = append(workers, c.Worker)
			}
			worst[c.Worker] = culprit{c.Event, n}
		}
	}
	for _, id := range workers {
		w := j.counts.Workers[id]
		w.Crashes++
		w.LastEvent, w.LastAt = worst[id].event, now
		j.counts.Workers[id] = w
	}
	if len(j.counts.Events) > MaxEvents {
		sort.SliceStable(j.counts.Events, func(a, b int) bool { return j.counts.Events[a].LastAt.After(j.counts.Events[b].LastAt) })
		j.counts.Events = j.counts.Events[:MaxEvents]
	}
}

func (j *Journal) refreshSuspects() {
	m := map[key]struct{}{}
	for _, e := range j.counts.Events {
		if e.Crashes >= j.opts.EventCrashes {
			m[key{e.Worker, e.Event, e.SourceHash}] = struct{}{}
		}
	}
	if len(m) == 0 {
		j.suspects.Store(nil)
		return
	}
	j.suspects.Store(&m)
}

// Acquire takes a free slot; false when every slot is taken (the call then
// runs without being journaled).
func (j *Journal) Acquire() (Slot, bool) {
	if j == nil {
		return -1, false
	}
	j.freeMu.Lock()
	defer j.freeMu.Unlock()
	if len(j.free) == 0 {
		return -1, false
	}
	i := j.free[len(j.free)-1]
	j.free = j.free[:len(j.free)-1]
	return Slot(i), true
}

// Release gives a slot back; it must not be in a call.
func (j *Journal) Release(s Slot) {
	if j == nil || s < 1 {
		return
	}
	j.Leave(s)
	j.freeMu.Lock()
	j.free = append(j.free, int(s))
	j.freeMu.Unlock()
}

func (j *Journal) slot(s Slot) []byte {
	off := int(s) * SlotSize
	return j.mem[off : off+SlotSize : off+SlotSize]
}

// Enter records that worker is calling native code with event (source,
// id) in slot s.
func (j *Journal) Enter(s Slot, worker, source, id string) {
	if j == nil || s < 1 {
		return
	}
	b := j.slot(s)
	worker, id = bound(worker, maxWorker), bound(id, maxEvent)
	b[offWorkerLen] = byte(copy(b[offWorker:offWorker+maxWorker], worker))
	b[offEventLen] = byte(copy(b[offEvent:offEvent+maxEvent], id))
	binary.LittleEndian.PutUint64(b[offSourceHash:], SourceHash(source))
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[offState])), 1)
}

// Leave records that the call in slot s returned.
func (j *Journal) Leave(s Slot) {
	if j == nil || s < 1 {
		return
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&j.slot(s)[offState])), 0)
}

// Suspect reports whether (worker, event source, event id) was in flight at
// Options.EventCrashes crashes or more: it must not run again.
func (j *Journal) Suspect(worker, source, id string) bool {
	if j == nil {
		return false
	}
	p := j.suspects.Load()
	if p == nil {
		return false
	}
	_, ok := (*p)[key{bound(worker, maxWorker), bound(id, maxEvent), SourceHash(source)}]
	return ok
}

// Quarantined resets worker's crash count once its quarantine is recorded
// (the next crash counts from zero); its suspect events stay.
func (j *Journal) Quarantined(worker string) error {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.counts.Workers[worker]; !ok {
		return nil
	}
	delete(j.counts.Workers, worker)
	return j.saveLocked()
}

// Forget drops worker's crash count and suspect events (its code was
// replaced or its quarantine lifted by hand: it may try again).
func (j *Journal) Forget(worker string) error {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	_, had := j.counts.Workers[worker]
	delete(j.counts.Workers, worker)
	kept := j.counts.Events[:0]
	w := bound(worker, maxWorker)
	for _, e := range j.counts.Events {
		if e.Worker != w {
			kept = append(kept, e)
		}
	}
	if !had && len(kept) == len(j.counts.Events) {
		return nil
	}
	j.counts.Events = kept
	j.refreshSuspects()
	return j.saveLocked()
}

// Close marks the journal clean (the node stopped normally: calls still in
// native code now are not a crash) and unmaps it.
func (j *Journal) Close() error {
	if j == nil || j.mem == nil {
		return nil
	}
	binary.LittleEndian.PutUint32(j.mem[offClean:], 1)
	if j.crashOut != nil {
		_ = debug.SetCrashOutput(nil, debug.CrashOptions{})
		j.crashOut.Close()
		os.Remove(j.crashOut.Name()) // a normal stop: no report
		j.crashOut = nil
	}
	return j.unmap()
}

// CrashReport is the first line of the crash report the process with
// the journal in dir wrote when it died (Options.CrashOutput), e.g.
// "SIGSEGV: segmentation violation"; "" when it wrote none. Read it before
// the next Open, which empties the file.
func CrashReport(dir string) string {
	f, err := os.Open(filepath.Join(dir, CrashOutputFile))
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 4096)
	n, _ := io.ReadFull(f, b)
	for _, l := range strings.Split(string(b[:n]), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}

// takeCrashOutput reads the first line of what the last crash reported,
// if any, and makes CrashOutputFile, emptied, this process's crash output.
func (j *Journal) takeCrashOutput() (string, error) {
	path := filepath.Join(j.dir, CrashOutputFile)
	first := CrashReport(j.dir)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("crash journal: open %s: %w", path, err)
	}
	if err := debug.SetCrashOutput(f, debug.CrashOptions{}); err != nil {
		f.Close()
		return "", fmt.Errorf("crash journal: set the crash output: %w", err)
	}
	j.crashOut = f
	return first, nil
}

// Dir is the journal's directory.
func (j *Journal) Dir() string { return j.dir }

// SourceHash is the hash of an event source the journal keeps.
func SourceHash(source string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(source))
	return h.Sum64()
}

// bound is s, or "sha256:<hex>" of it when longer than max.
func bound(s string, max int) string {
	if len(s) <= max {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// parse reads the busy slots of a journal file's bytes; clean reports the
// header's flag. A file of another layout has none.
func parse(b []byte) (calls []Call, clean, ok bool) {
	if len(b) < SlotSize || string(b[:8]) != magic {
		return nil, true, false
	}
	n := int(binary.LittleEndian.Uint32(b[offSlots:]))
	clean = binary.LittleEndian.Uint32(b[offClean:]) == 1
	for i := 1; i <= n && (i+1)*SlotSize <= len(b); i++ {
		s := b[i*SlotSize : (i+1)*SlotSize]
		if binary.LittleEndian.Uint32(s[offState:]) != 1 {
			continue
		}
		wl, el := min(int(s[offWorkerLen]), maxWorker), min(int(s[offEventLen]), maxEvent)
		calls = append(calls, Call{Worker: string(s[offWorker : offWorker+wl]), Event: string(s[offEvent : offEvent+el]),
			SourceHash: binary.LittleEndian.Uint64(s[offSourceHash:])})
	}
	return calls, clean, true
}

// Peek reads, without changing anything, the calls a crash left in the
// journal in dir (none when the node stopped normally, or none is there):
// what a supervisor prints when the node died.
func Peek(dir string) ([]Call, error) {
	b, err := os.ReadFile(filepath.Join(dir, JournalFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	calls, clean, _ := parse(b)
	if clean {
		return nil, nil
	}
	return calls, nil
}

// Describe is a one-line account of calls for logs and supervisors.
func Describe(calls []Call) string {
	parts := make([]string, 0, len(calls))
	for _, c := range calls {
		parts = append(parts, fmt.Sprintf("worker %s event %s", c.Worker, c.Event))
	}
	return strings.Join(parts, "; ")
}

func readCounts(path string) (Counts, error) {
	var c Counts
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("crash journal: read %s: %w", path, err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		// A damaged file costs the counts, not the node.
		return Counts{}, nil
	}
	return c, nil
}

// saveLocked writes the counts file atomically (a temporary file synced,
// renamed over it, the directory synced).
func (j *Journal) saveLocked() error {
	b, err := json.MarshalIndent(j.counts, "", " ")
	if err != nil {
		return err
	}
	path := filepath.Join(j.dir, CountsFile)
	tmp, err := os.CreateTemp(j.dir, CountsFile+".*")
	if err != nil {
		return fmt.Errorf("crash journal: write the counts: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("crash journal: write the counts: %w", err)
	}
	if d, err := os.Open(j.dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
