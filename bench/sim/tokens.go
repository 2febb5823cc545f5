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

// keyRoot is the parent of the first block's key.
const keyRoot = uint64(0x6b76726f75746573) // arbitrary

// blockKeys returns the chained keys of the whole blocks of prompt: key_i =
// H(key_{i-1}, bytes of block i), key_{-1} = a fixed root. Only whole blocks
// get a key; a trailing partial block never hits.
func blockKeys(prompt []byte, blockSize int) []uint64 {
	bb := blockSize * BytesPerToken
	return chainKeys(make([]uint64, 0, len(prompt)/bb), keyRoot, prompt, bb)
}

// chainKeys appends to dst the keys of the whole blocks of bb bytes of b,
// the first chained to parent (keyRoot at the start of a prompt, else the
// key of the block before b).
func chainKeys(dst []uint64, parent uint64, b []byte, bb int) []uint64 {
	for off := 0; off+bb <= len(b); off += bb {
		h := fnvUint64(fnvOffset, parent)
		h = fnvBytes(h, b[off:off+bb])
		dst = append(dst, h)
		parent = h
	}
	return dst
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

// appendAnswer appends the first n output tokens of a request with seed s.
func appendAnswer(dst []byte, s uint64, n int) []byte {
	for i := 0; i < n; i++ {
		dst = append(dst, tokenText(s, i)...)
	}
	return dst
}

// The rendering of an answer carried back as the next turn's assistant
// message (renderChat of a message with role "assistant" and the answer as
// its content, no name, no tool calls) is assistantOpen + answer + "\n".
// It directly follows the previous prompt's rendering, which ends with its
// last message's "\n": so prompt + assistantOpen + answer + "\n" is a
// prefix of the next turn's rendering. For completions, the next prompt is
// the previous prompt followed by the answer text.
const assistantOpen = "<|assistant|>"

// appendTranscript appends to dst what follows a prompt in the next turn's
// rendering when the client sends back the first n output tokens of a
// request with seed s: for chat, the assistant message; for completions,
// the text itself.
func appendTranscript(dst []byte, chat bool, s uint64, n int) []byte {
	if chat {
		dst = append(dst, assistantOpen...)
	}
	dst = appendAnswer(dst, s, n)
	if chat {
		dst = append(dst, '\n')
	}
	return dst
}

// promptSeed is the seed of a request's output: a hash of its rendered
// prompt, mixed with the request's "seed" field when it has one.
func promptSeed(prompt []byte, seed *int64) uint64 {
	s := fnvBytes(fnvOffset, prompt)
	if seed != nil {
		s = fnvUint64(s, uint64(*seed))
	}
	return s
}

// Message is one plain chat message (a string content, no name, no tool
// calls), as RenderChat and ChatAnswerText read it.
type Message struct {
	Role    string
	Content string
}

// RenderChat returns the replica's rendering of a conversation without
// tools: for every message "<|role|>" content "\n". It is the prompt the
// replica tokenizes, hashes into blocks and seeds its answer with.
func RenderChat(msgs []Message) []byte {
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 5
	}
	b := make([]byte, 0, n)
	for _, m := range msgs {
		b = append(b, "<|"...)
		b = append(b, m.Role...)
		b = append(b, "|>"...)
		b = append(b, m.Content...)
		b = append(b, '\n')
	}
	return b
}

// AnswerText returns the text a replica generates when its n output tokens
// answer a request whose rendered prompt is prompt (RenderChat of the
// messages of a chat request, or the prompt of a completions request as
// sent) and which carries no "seed" field: the chat message's content, or
// the completion's text. It is n*BytesPerToken bytes of words from the
// replica's vocabulary, each with a leading space; n is the response's
// usage.completion_tokens (max_tokens with ignore_eos, else see
// CompletionTokens).
func AnswerText(prompt []byte, n int) string {
	return string(appendAnswer(make([]byte, 0, max(n, 0)*BytesPerToken), promptSeed(prompt, nil), n))
}

// ChatAnswerText is AnswerText for a chat request of plain messages.
func ChatAnswerText(msgs []Message, n int) string { return AnswerText(RenderChat(msgs), n) }

// CompletionTokens returns how many tokens a replica generates for a request
// with rendered prompt prompt, no "seed" field, max_tokens maxTokens (at
// least 1), min_tokens minTokens and ignore_eos ignoreEOS: maxTokens with
// ignore_eos, else a deterministic early stop uniform in [max(1,
// maxTokens/2, min(minTokens, maxTokens)), maxTokens].
func CompletionTokens(prompt []byte, maxTokens, minTokens int, ignoreEOS bool) int {
	return stopAfter(promptSeed(prompt, nil), maxTokens, minTokens, ignoreEOS)
}

// stopAfter is the number of tokens generated by a request with seed s.
func stopAfter(s uint64, maxTokens, minTokens int, ignoreEOS bool) int {
	if ignoreEOS || maxTokens < 1 {
		return maxTokens
	}
	lo := max(1, maxTokens/2, min(minTokens, maxTokens))
	return lo + int(fnvUint64(s, uint64(maxTokens))%uint64(maxTokens-lo+1))
}
