package shortcircuit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Version is the protocol version this package speaks. Both sides refuse any other, so a
// future change of the messages can never be misread by an older peer.
const Version = 1

const (
	// maxRequest bounds a request line, newline included. A valid id is at most
	// blockindex.MaxIDLength (200) bytes and needs no JSON escaping, so every valid request
	// fits with room to spare; the bound keeps a client from making the worker buffer
	// arbitrary amounts of data.
	maxRequest = 1024
	// maxErrorMessage bounds the error text of a response. Even if every byte of it needed a
	// six-byte JSON escape, the response still fits in maxResponse.
	maxErrorMessage = 512
	// maxResponse bounds a response line, newline included.
	maxResponse = 4096
	// maxFDs is how many descriptors the client makes room for in one read. A correct server
	// sends one; room for more lets the client see (and close) surplus descriptors instead of
	// having the kernel truncate the control message.
	maxFDs = 8
)

// Error codes of a failed response.
const (
	codeNotFound = "not_found"
	codeInvalid  = "invalid"
	codeInternal = "internal"
)

// Sentinel errors that callers act on; test for them with errors.Is.
var (
	// ErrNotFound: the worker holds no block of that id. The caller reads it another way
	// (through the worker's data plane, which fetches missing blocks).
	ErrNotFound = errors.New("block not found")
	// ErrInvalid: the worker refused the request itself, such as an id that is not a valid
	// block id. Sending it again cannot succeed.
	ErrInvalid = errors.New("invalid short-circuit request")
	// ErrClosed: the client has been closed.
	ErrClosed = errors.New("short-circuit client closed")
)

// errBadRequest marks a request the server could not decode; the connection is closed after
// the error response because the client and the server no longer agree on the framing.
var errBadRequest = errors.New("malformed request")

// request asks for one block.
type request struct {
	V     int    `json:"v"`
	Block string `json:"block"`
}

// okHeader answers a request that succeeded; the block's descriptor travels with it.
type okHeader struct {
	V      int    `json:"v"`
	Size   int64  `json:"size"`
	CRC32C uint32 `json:"crc32c"`
	Tier   string `json:"tier"`
}

// errHeader answers a request that failed; no descriptor travels with it.
type errHeader struct {
	V     int    `json:"v"`
	Error string `json:"error"`
	Code  string `json:"code"`
}

// header is what the client decodes either response into.
type header struct {
	V      int    `json:"v"`
	Size   int64  `json:"size"`
	CRC32C uint32 `json:"crc32c"`
	Tier   string `json:"tier"`
	Error  string `json:"error"`
	Code   string `json:"code"`
}

// failed reports whether the header is an error response.
func (h header) failed() bool { return h.Code != "" || h.Error != "" }

// encodeRequest is the request line for block id. An id too long for any request is refused
// here, without a round trip, so that the connection is not closed for it.
func encodeRequest(id string) ([]byte, error) {
	line, err := json.Marshal(request{V: Version, Block: id})
	if err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	line = append(line, '\n')
	if len(line) > maxRequest {
		return nil, fmt.Errorf("%w: the request would take %d bytes, at most %d allowed", ErrInvalid, len(line), maxRequest)
	}
	return line, nil
}

// decodeRequest decodes one request line (without its newline) strictly: unknown fields,
// trailing data and other versions are refused, so that a client that speaks something else
// learns it at once instead of being half understood.
func decodeRequest(line []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var req request
	if err := dec.Decode(&req); err != nil {
		return "", fmt.Errorf("%w: %w", errBadRequest, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("%w: data after the request object", errBadRequest)
	}
	if req.V != Version {
		return "", fmt.Errorf("%w: protocol version %d, this worker speaks %d", errBadRequest, req.V, Version)
	}
	return req.Block, nil
}

// encodeError is the response line for a failed request.
func encodeError(code string, err error) []byte {
	msg := err.Error()
	if len(msg) > maxErrorMessage {
		msg = strings.ToValidUTF8(msg[:maxErrorMessage], "") + "…"
	}
	line, mErr := json.Marshal(errHeader{V: Version, Error: msg, Code: code})
	if mErr != nil {
		// Marshalling a struct of strings and ints cannot fail; keep a well-formed answer anyway.
		line = []byte(`{"v":1,"error":"internal error","code":"internal"}`)
	}
	return append(line, '\n')
}

// encodeOK is the response line for a successful request.
func encodeOK(size int64, crc uint32, tier string) ([]byte, error) {
	line, err := json.Marshal(okHeader{V: Version, Size: size, CRC32C: crc, Tier: tier})
	if err != nil {
		return nil, fmt.Errorf("encoding response: %w", err)
	}
	return append(line, '\n'), nil
}

// serverError is a failure the server reported for one request. The connection is still in
// step after it, so the client keeps using it.
type serverError struct {
	code, msg string
}

func (e *serverError) Error() string { return "worker: " + e.msg }

// Is makes errors.Is match ErrNotFound and ErrInvalid by the response's code.
func (e *serverError) Is(target error) bool {
	return (target == ErrNotFound && e.code == codeNotFound) || (target == ErrInvalid && e.code == codeInvalid)
}
