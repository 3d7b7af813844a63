package fleetapi

import (
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

// deltaWindow is the window of deltas: larger than any executable of
// tether, so that every byte of the old one can be referred to.
const deltaWindow = 256 << 20

// EncodeDelta writes to w the delta that turns old into the bytes read
// from cur: zstd at its best level with old as a raw dictionary. (At the
// lower levels the encoder does not use a raw dictionary this large.)
func EncodeDelta(w io.Writer, old []byte, cur io.Reader) error {
	enc, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedBestCompression),
		zstd.WithEncoderDictRaw(0, old), zstd.WithWindowSize(deltaWindow), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return fmt.Errorf("delta encoder: %w", err)
	}
	if _, err := io.Copy(enc, cur); err != nil {
		enc.Close()
		return fmt.Errorf("encode delta: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("encode delta: %w", err)
	}
	return nil
}

// DecodeDelta writes to w the bytes a delta from old (EncodeDelta) read
// from delta stands for, at most limit of them.
func DecodeDelta(w io.Writer, old []byte, delta io.Reader, limit int64) error {
	dec, err := zstd.NewReader(delta, zstd.WithDecoderDictRaw(0, old),
		zstd.WithDecoderMaxWindow(deltaWindow), zstd.WithDecoderMaxMemory(uint64(limit)+deltaWindow), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return fmt.Errorf("delta decoder: %w", err)
	}
	defer dec.Close()
	n, err := io.Copy(w, io.LimitReader(dec, limit+1))
	if err != nil {
		return fmt.Errorf("decode delta: %w", err)
	}
	if n > limit {
		return fmt.Errorf("decode delta: more than the release's %d bytes", limit)
	}
	return nil
}
