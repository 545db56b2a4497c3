package tlsbatch

import "net"

// HeldBuffers is the number of pooled buffers the batched connection c holds now. Called only
// while no read or write of c is in flight.
func HeldBuffers(c net.Conn) int {
	b := c.(*flushingConn).records
	b.mu.Lock()
	defer b.mu.Unlock()
	held := 0
	if b.readBuf != nil {
		held++
	}
	if b.batchBuf != nil {
		held++
	}
	return held
}
