package sim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// The sim's "tokenizer": a prompt is a byte string (for chat, a canonical
// rendering of the conversation); it has ceil(len/BytesPerToken) tokens and
// its whole blocks of BlockSize*BytesPerToken bytes get chained 64-bit keys.

// numTokens is the token count of a prompt of n bytes.
func numTokens(n int) int {
	return (n + BytesPerToken - 1) / BytesPerToken
}

// FNV-1a 64-bit parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvBytes(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}

func fnvUint64(h, v uint64) uint64 {
	for i := 0; i < 8; i++ {
		h ^= v & 0xff
		h *= fnvPrime
		v >>= 8
	}
	return h
}

// blockKeys returns the chained keys of the whole blocks of prompt: key_i =
// H(key_{i-1}, bytes of block i), key_{-1} = a fixed root. Only whole blocks
// get a key; a trailing partial block never hits.
func blockKeys(prompt []byte, blockSize int) []uint64 {
	bb := blockSize * BytesPerToken
	n := len(prompt) / bb
	keys := make([]uint64, n)
	parent := uint64(0x6b76726f75746573) // arbitrary root
	for i := 0; i < n; i++ {
		h := fnvUint64(fnvOffset, parent)
		h = fnvBytes(h, prompt[i*bb:(i+1)*bb])
		keys[i] = h
		parent = h
	}
	return keys
}

// chatMessage is one message of a chat request, kept raw where its shape
// varies.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

// renderChat renders a conversation canonically, in order: the tools (as
// compact JSON) and then, for every message, "<|role|>" [name] content
// [tool calls] "\n". Content may be a string, null, or an array of parts
// (text parts contribute their text, other parts their compact JSON).
func renderChat(tools json.RawMessage, msgs []chatMessage) ([]byte, error) {
	var b bytes.Buffer
	if isPresent(tools) {
		b.WriteString("<|tools|>")
		if err := json.Compact(&b, tools); err != nil {
			return nil, fmt.Errorf("tools: %w", err)
		}
		b.WriteByte('\n')
	}
	for i, m := range msgs {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d]: missing role", i)
		}
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>")
		if m.Name != "" {
			b.WriteString(m.Name)
			b.WriteString(": ")
		}
		if m.ToolCallID != "" {
			b.WriteString(m.ToolCallID)
			b.WriteString(": ")
		}
		if err := renderContent(&b, m.Content); err != nil {
			return nil, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		if isPresent(m.ToolCalls) {
			if err := json.Compact(&b, m.ToolCalls); err != nil {
				return nil, fmt.Errorf("messages[%d].tool_calls: %w", i, err)
			}
		}
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

func isPresent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

func renderContent(b *bytes.Buffer, raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if !isPresent(raw) {
		return nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return err
		}
		b.WriteString(s)
		return nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return err
		}
		for _, p := range parts {
			var tp struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(p, &tp); err != nil {
				return err
			}
			if tp.Type == "text" && tp.Text != nil {
				b.WriteString(*tp.Text)
				continue
			}
			if err := json.Compact(b, p); err != nil {
				return err
			}
		}
		return nil
	default:
		return errors.New("must be a string, an array of parts or null")
	}
}

// renderPrompt renders a completions prompt: a string, an array of strings
// (concatenated), an array of token ids (each id BytesPerToken little-endian
// bytes, so one id is exactly one token) or an array of such arrays
// (concatenated). vLLM would answer a batch with several choices; the sim
// answers one.
func renderPrompt(raw json.RawMessage) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if !isPresent(raw) {
		return nil, errors.New("prompt is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []byte(s), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, err
		}
		var out []byte
		for _, it := range items {
			it = bytes.TrimSpace(it)
			if len(it) == 0 {
				continue
			}
			switch it[0] {
			case '"':
				var s string
				if err := json.Unmarshal(it, &s); err != nil {
					return nil, err
				}
				out = append(out, s...)
			case '[':
				var ids []uint32
				if err := json.Unmarshal(it, &ids); err != nil {
					return nil, fmt.Errorf("token ids: %w", err)
				}
				out = appendIDs(out, ids)
			default:
				var id uint32
				if err := json.Unmarshal(it, &id); err != nil {
					return nil, fmt.Errorf("token ids: %w", err)
				}
				out = appendIDs(out, []uint32{id})
			}
		}
		return out, nil
	default:
		return nil, errors.New("prompt must be a string or an array")
	}
}

func appendIDs(out []byte, ids []uint32) []byte {
	for _, id := range ids {
		out = binary.LittleEndian.AppendUint32(out, id)
	}
	return out
}

// vocab is the sim's output vocabulary: every word is exactly BytesPerToken
// bytes, so n generated tokens re-read as a prompt are n tokens again.
var vocab = [...]string{
	" the", " and", " for", " you", " are", " not", " but", " one",
	" all", " can", " her", " was", " its", " new", " now", " way",
}

// tokenText is the text of the i-th output token of a request with seed s.
func tokenText(s uint64, i int) string {
	h := s + uint64(i)*0x9e3779b97f4a7c15
	h ^= h >> 31
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 29
	return vocab[h%uint64(len(vocab))]
}
