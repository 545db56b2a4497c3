package blockindex

// CombineChecksums is the CRC-32C of bytes a, then b, from the CRC-32C of each (sumA, sumB) and
// the length of b, without the bytes: parts of a block written out of order are summed as they
// arrive and joined once the parts before them are in.
//
// A CRC is linear over GF(2): appending lenB zero bytes to a is multiplying its CRC register
// by a fixed 32x32 matrix (x^(8·lenB) modulo the polynomial), taken here by repeated squaring
// of the matrix for one zero bit; then b's CRC is added (the pre- and post-inversions of the
// standard CRC cancel out in that sum).
func CombineChecksums(sumA, sumB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return sumA
	}
	// odd: the operator of one zero bit; its first row is the (reflected) polynomial.
	var even, odd gf2Matrix
	odd[0] = castagnoliReflected
	for n, row := 1, uint32(1); n < 32; n, row = n+1, row<<1 {
		odd[n] = row
	}
	even.square(&odd) // two zero bits
	odd.square(&even) // four
	for {
		even.square(&odd) // eight, then 32, 128, ...: one zero byte, then 4, 16, ...
		if lenB&1 != 0 {
			sumA = even.times(sumA)
		}
		if lenB >>= 1; lenB == 0 {
			break
		}
		odd.square(&even)
		if lenB&1 != 0 {
			sumA = odd.times(sumA)
		}
		if lenB >>= 1; lenB == 0 {
			break
		}
	}
	return sumA ^ sumB
}

// castagnoliReflected is CRC-32C's polynomial, bits reflected, as hash/crc32 computes it.
const castagnoliReflected = 0x82f63b78

// gf2Matrix is a 32x32 matrix over GF(2), row n the image of bit n.
type gf2Matrix [32]uint32

func (m *gf2Matrix) times(vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= m[i]
		}
	}
	return sum
}

// square sets m to a·a.
func (m *gf2Matrix) square(a *gf2Matrix) {
	for n := range m {
		m[n] = a.times(a[n])
	}
}
