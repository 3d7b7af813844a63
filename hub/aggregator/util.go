package aggregator

import (
	"encoding/pem"
	"errors"
	"io"
)

// copyLimited copies at most limit bytes of r to w and fails when r holds
// more.
func copyLimited(w io.Writer, r io.Reader, limit int64) (int64, error) {
	n, err := io.Copy(w, io.LimitReader(r, limit+1))
	if err != nil {
		return n, err
	}
	if n > limit {
		return n, errors.New("response too large")
	}
	return n, nil
}

// pemEncode writes der as a PEM certificate.
func pemEncode(w io.Writer, der []byte) error {
	return pem.Encode(w, &pem.Block{Type: "CERTIFICATE", Bytes: der})
}
