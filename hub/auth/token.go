package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// ErrInvalidToken is returned for a bearer token that is not known.
var ErrInvalidToken = errors.New("invalid bearer token")

// TokenFile authenticates bearer tokens listed in a CSV file with the layout
// of the upstream --token-auth-file: token,user,uid,"group1,group2". Lines
// starting with # are ignored. The file is read again when its modification
// time or size changes.
type TokenFile struct {
	path string

	mu      sync.Mutex
	mod     time.Time
	size    int64
	entries []tokenEntry
}

type tokenEntry struct {
	sum  [sha256.Size]byte
	user User
}

// NewTokenFile reads path and returns an authenticator over its tokens.
func NewTokenFile(path string) (*TokenFile, error) {
	t := &TokenFile{path: path}
	if err := t.reload(); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *TokenFile) reload() error {
	st, err := os.Stat(t.path)
	if err != nil {
		return fmt.Errorf("read token file: %w", err)
	}
	if st.ModTime().Equal(t.mod) && st.Size() == t.size && t.entries != nil {
		return nil
	}
	f, err := os.Open(t.path)
	if err != nil {
		return fmt.Errorf("read token file: %w", err)
	}
	defer f.Close()
	entries, err := parseTokens(f)
	if err != nil {
		return fmt.Errorf("parse token file %s: %w", t.path, err)
	}
	t.entries, t.mod, t.size = entries, st.ModTime(), st.Size()
	return nil
}

func parseTokens(r io.Reader) ([]tokenEntry, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	entries := []tokenEntry{}
	seen := map[string]bool{}
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			return entries, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read record: %w", err)
		}
		if len(rec) < 3 {
			return nil, fmt.Errorf("record %d: want at least token,user,uid, got %d fields", line, len(rec))
		}
		tok, name := strings.TrimSpace(rec[0]), strings.TrimSpace(rec[1])
		if tok == "" || name == "" {
			return nil, fmt.Errorf("record %d: empty token or user", line)
		}
		if seen[tok] {
			return nil, fmt.Errorf("record %d: duplicate token", line)
		}
		seen[tok] = true
		u := User{Name: name, UID: strings.TrimSpace(rec[2])}
		if len(rec) > 3 {
			for _, g := range strings.Split(rec[3], ",") {
				if g = strings.TrimSpace(g); g != "" {
					u.Groups = append(u.Groups, g)
				}
			}
		}
		if !slices.Contains(u.Groups, GroupAuthenticated) {
			u.Groups = append(u.Groups, GroupAuthenticated)
		}
		entries = append(entries, tokenEntry{sum: sha256.Sum256([]byte(tok)), user: u})
	}
}

// Authenticate implements [Authenticator].
func (t *TokenFile) Authenticate(r *http.Request) (*User, bool, error) {
	tok, ok := bearer(r)
	if !ok {
		return nil, false, nil
	}
	t.mu.Lock()
	// A file that vanished or became unreadable keeps the last good set.
	_ = t.reload()
	entries := t.entries
	t.mu.Unlock()
	sum := sha256.Sum256([]byte(tok))
	var found *User
	for i := range entries {
		if subtle.ConstantTimeCompare(sum[:], entries[i].sum[:]) == 1 {
			found = &entries[i].user
		}
	}
	if found == nil {
		return nil, false, ErrInvalidToken
	}
	u := *found
	u.Groups = slices.Clone(u.Groups)
	return &u, true, nil
}

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(r *http.Request) (string, bool) {
	h := strings.TrimSpace(r.Header.Get("Authorization"))
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}
