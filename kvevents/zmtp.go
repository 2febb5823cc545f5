package kvevents

import "encoding/binary"

// ZMTPHandshake is what a ZMTP 3.0 peer of socketType ("PUB", "ROUTER")
// with the NULL mechanism sends first: its greeting and its READY
// command. With AppendZMTPFrame it writes raw streams for tests and the
// attack bench, which need frames no socket library would send.
func ZMTPHandshake(socketType string) []byte {
	g := make([]byte, greetingBytes)
	g[0], g[9] = 0xff, 0x7f // signature
	g[10] = 3               // version 3.0
	copy(g[12:], "NULL")    // mechanism; as-server and filler stay 0
	body := append([]byte{5}, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(socketType))) //nolint:gosec // a socket type's name
	body = append(body, socketType...)
	return append(AppendZMTPHeader(g, flagCommand, uint64(len(body))), body...)
}

// AppendZMTPHeader appends a frame header of the given flags (more 0x01,
// command 0x04) declaring size bytes, in the short form when it fits.
func AppendZMTPHeader(dst []byte, flags byte, size uint64) []byte {
	if size > 255 {
		dst = append(dst, flags|flagLong)
		return binary.BigEndian.AppendUint64(dst, size)
	}
	return append(dst, flags, byte(size))
}

// AppendZMTPMessage appends a message of the frames given, each but the
// last flagged more.
func AppendZMTPMessage(dst []byte, frames ...[]byte) []byte {
	for i, f := range frames {
		var fl byte
		if i < len(frames)-1 {
			fl = flagMore
		}
		dst = append(AppendZMTPHeader(dst, fl, uint64(len(f))), f...)
	}
	return dst
}
