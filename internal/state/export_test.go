package state

// Queued is how many Gets and Puts wait for the next batch.
func (b *Batching) Queued() int { return b.gets.Queued() + b.puts.Queued() }
