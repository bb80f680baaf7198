package state

// Queued is how many Gets and Puts wait for the next batch.
func (b *Batching) Queued() int {
	b.gets.mu.Lock()
	n := len(b.gets.pending)
	b.gets.mu.Unlock()
	b.puts.mu.Lock()
	defer b.puts.mu.Unlock()
	return n + len(b.puts.pending)
}
