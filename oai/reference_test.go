// This file keeps the fastjson-based parser that oai.Parse replaced, as the
// reference for FuzzParseMatchesReference and the old/new benchmarks. It is
// the previous parse.go with its functions renamed (ref...); do not change its
// behaviour, except to teach it a field Parse learned since (cache_salt).

package oai

import (
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

var refParserPool fastjson.ParserPool

// refParse reads the routing fields of body for a request of kind k. It checks
// the shape of the fields routing needs and nothing else: every other field
// is left to the replica. A bad body yields an *Error with status 400.
//
// The returned Request owns all its memory; body may be reused afterwards.
func refParse(k Kind, body []byte) (*Request, error) {
	if len(body) == 0 {
		return nil, BadRequest("request body is empty; expected a JSON object", "")
	}
	if !utf8.Valid(body) {
		return nil, BadRequest("request body is not valid UTF-8", "")
	}
	p := refParserPool.Get()
	defer refParserPool.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, BadRequest("request body is not valid JSON: "+refShorten(err.Error()), "")
	}
	obj, err := v.Object()
	if err != nil {
		return nil, BadRequest("request body must be a JSON object, got "+v.Type().String(), "")
	}
	req := &Request{Kind: k}
	if err := refReadCommon(req, obj); err != nil {
		return nil, err
	}
	switch k {
	case KindChat:
		err = refReadChat(req, obj)
	case KindCompletion:
		err = refReadPrompt(&req.Prompt, obj.Get("prompt"), "prompt")
	case KindEmbedding:
		err = refReadPrompt(&req.Prompt, obj.Get("input"), "input")
	case KindResponses:
		err = refReadResponses(req, obj)
	case KindGenerate:
		err = refReadGenerate(req, obj)
	}
	if err != nil {
		return nil, err
	}
	return req, nil
}

func refReadCommon(req *Request, obj *fastjson.Object) error {
	if m := obj.Get("model"); m != nil && m.Type() != fastjson.TypeNull {
		b, err := m.StringBytes()
		if err != nil {
			return BadRequest("'model' must be a string", "model")
		}
		req.Model = string(b)
	}
	if s := obj.Get("stream"); s != nil && s.Type() != fastjson.TypeNull {
		b, err := s.Bool()
		if err != nil {
			return BadRequest("'stream' must be a boolean", "stream")
		}
		req.Stream = b
	}
	if u := obj.Get("user"); u != nil && u.Type() != fastjson.TypeNull {
		b, err := u.StringBytes()
		if err != nil {
			return BadRequest("'user' must be a string", "user")
		}
		req.User = string(b)
	}
	if s := obj.Get("cache_salt"); s != nil && s.Type() != fastjson.TypeNull {
		b, err := s.StringBytes()
		if err != nil {
			return BadRequest("'cache_salt' must be a string", "cache_salt")
		}
		if len(b) > MaxCacheSaltBytes {
			return BadRequest(fmt.Sprintf("'cache_salt' must be at most %d bytes", MaxCacheSaltBytes), "cache_salt")
		}
		req.CacheSalt = string(b)
	}
	if v := obj.Get("priority"); v != nil && v.Type() == fastjson.TypeNumber {
		if n, err := strconv.ParseInt(string(v.MarshalTo(nil)), 10, 32); err == nil {
			req.Priority, req.HasPriority = int(n), true
		}
	}
	return nil
}

func refReadChat(req *Request, obj *fastjson.Object) error {
	if t := obj.Get("tools"); t != nil && t.Type() != fastjson.TypeNull {
		if t.Type() != fastjson.TypeArray {
			return BadRequest("'tools' must be an array", "tools")
		}
		req.Tools = string(t.MarshalTo(nil))
	}
	mv := obj.Get("messages")
	if mv == nil {
		return BadRequest("'messages' is required", "messages")
	}
	msgs, err := mv.Array()
	if err != nil {
		return BadRequest("'messages' must be an array", "messages")
	}
	if len(msgs) == 0 {
		return BadRequest("'messages' must contain at least one message", "messages")
	}
	req.Messages = make([]Message, 0, len(msgs))
	for i, m := range msgs {
		msg, err := refReadMessage(m, fmt.Sprintf("messages[%d]", i))
		if err != nil {
			return err
		}
		req.Messages = append(req.Messages, msg)
	}
	return nil
}

// refReadMessage reads one chat message: its role and content, plus name and
// tool calls folded in as text so they shape the key.
func refReadMessage(m *fastjson.Value, where string) (Message, error) {
	o, err := m.Object()
	if err != nil {
		return Message{}, BadRequest(where+" must be an object", "messages")
	}
	rv := o.Get("role")
	if rv == nil {
		return Message{}, BadRequest(where+".role is required", "messages")
	}
	role, err := rv.StringBytes()
	if err != nil {
		return Message{}, BadRequest(where+".role must be a string", "messages")
	}
	msg := Message{Role: string(role)}
	if n := o.Get("name"); n != nil && n.Type() == fastjson.TypeString {
		msg.Parts = append(msg.Parts, Part{Text: "name:" + string(n.GetStringBytes()), IsText: true})
	}
	parts, err := refReadContent(o.Get("content"), where+".content")
	if err != nil {
		return Message{}, err
	}
	msg.Parts = append(msg.Parts, parts...)
	for _, key := range [...]string{"tool_calls", "function_call", "tool_call_id"} {
		if x := o.Get(key); x != nil && x.Type() != fastjson.TypeNull {
			msg.Parts = append(msg.Parts, Part{Text: string(x.MarshalTo(nil)), IsText: true})
		}
	}
	return msg, nil
}

// refReadContent reads a message content: a string, null, or an array of parts.
// Text parts keep their text; other parts are hashed whole.
func refReadContent(c *fastjson.Value, where string) ([]Part, error) {
	if c == nil || c.Type() == fastjson.TypeNull {
		return nil, nil
	}
	switch c.Type() {
	case fastjson.TypeString:
		return []Part{{Text: string(c.GetStringBytes()), IsText: true}}, nil
	case fastjson.TypeArray:
		items := c.GetArray()
		parts := make([]Part, 0, len(items))
		for j, it := range items {
			po, err := it.Object()
			if err != nil {
				if it.Type() == fastjson.TypeString { // responses API allows bare strings
					parts = append(parts, Part{Text: string(it.GetStringBytes()), IsText: true})
					continue
				}
				return nil, BadRequest(fmt.Sprintf("%s[%d] must be an object", where, j), "messages")
			}
			typ := string(po.Get("type").GetStringBytes())
			if tv := po.Get("text"); tv != nil && (typ == "text" || typ == "input_text" || typ == "output_text" || typ == "") {
				tb, err := tv.StringBytes()
				if err != nil {
					return nil, BadRequest(fmt.Sprintf("%s[%d].text must be a string", where, j), "messages")
				}
				parts = append(parts, Part{Text: string(tb), IsText: true})
				continue
			}
			parts = append(parts, Part{Hash: refHash64(it.MarshalTo(nil))})
		}
		return parts, nil
	}
	return nil, BadRequest(where+" must be a string, an array of content parts, or null", "messages")
}

// refReadPrompt reads a prompt of the shapes the OpenAI API accepts: a string, a
// list of strings, a list of token IDs, or a list of lists of token IDs.
func refReadPrompt(p *Prompt, v *fastjson.Value, name string) error {
	if v == nil || v.Type() == fastjson.TypeNull {
		return BadRequest("'"+name+"' is required", name)
	}
	bad := BadRequest("'"+name+"' must be a string, an array of strings, an array of token IDs, or an array of arrays of token IDs", name)
	switch v.Type() {
	case fastjson.TypeString:
		p.Texts = append(p.Texts, string(v.GetStringBytes()))
		return nil
	case fastjson.TypeArray:
	default:
		return bad
	}
	items := v.GetArray()
	if len(items) == 0 {
		return BadRequest("'"+name+"' must not be empty", name)
	}
	switch items[0].Type() {
	case fastjson.TypeString:
		for _, it := range items {
			b, err := it.StringBytes()
			if err != nil {
				return bad
			}
			p.Texts = append(p.Texts, string(b))
		}
	case fastjson.TypeNumber:
		toks, err := refReadTokens(items)
		if err != nil {
			return bad
		}
		p.Tokens = append(p.Tokens, toks)
	case fastjson.TypeArray:
		for _, it := range items {
			inner, err := it.Array()
			if err != nil {
				return bad
			}
			toks, err := refReadTokens(inner)
			if err != nil {
				return bad
			}
			p.Tokens = append(p.Tokens, toks)
		}
	default:
		return bad
	}
	return nil
}

func refReadTokens(items []*fastjson.Value) ([]uint32, error) {
	toks := make([]uint32, len(items))
	for i, it := range items {
		n, err := it.Uint()
		if err != nil || n > 1<<32-1 {
			return nil, fmt.Errorf("token %d is not a non-negative 32-bit integer", i)
		}
		toks[i] = uint32(n)
	}
	return toks, nil
}

// refReadResponses reads a /v1/responses body: optional instructions (a system
// message) and input (a string or an array of input items).
func refReadResponses(req *Request, obj *fastjson.Object) error {
	if iv := obj.Get("instructions"); iv != nil && iv.Type() != fastjson.TypeNull {
		b, err := iv.StringBytes()
		if err != nil {
			return BadRequest("'instructions' must be a string", "instructions")
		}
		req.Messages = append(req.Messages, Message{Role: "system", Parts: []Part{{Text: string(b), IsText: true}}})
	}
	if t := obj.Get("tools"); t != nil && t.Type() == fastjson.TypeArray {
		req.Tools = string(t.MarshalTo(nil))
	}
	in := obj.Get("input")
	if in == nil || in.Type() == fastjson.TypeNull {
		if obj.Get("previous_response_id") != nil {
			return nil
		}
		return BadRequest("'input' is required", "input")
	}
	switch in.Type() {
	case fastjson.TypeString:
		req.Messages = append(req.Messages, Message{Role: "user", Parts: []Part{{Text: string(in.GetStringBytes()), IsText: true}}})
		return nil
	case fastjson.TypeArray:
	default:
		return BadRequest("'input' must be a string or an array of input items", "input")
	}
	for i, it := range in.GetArray() {
		where := fmt.Sprintf("input[%d]", i)
		o, err := it.Object()
		if err != nil {
			return BadRequest(where+" must be an object", "input")
		}
		if o.Get("role") != nil {
			msg, err := refReadMessage(it, where)
			if err != nil {
				return err
			}
			req.Messages = append(req.Messages, msg)
			continue
		}
		// Other items (function call outputs, reasoning, ...) shape the key whole.
		req.Messages = append(req.Messages, Message{Role: "item", Parts: []Part{{Text: string(it.MarshalTo(nil)), IsText: true}}})
	}
	return nil
}

// refReadGenerate reads SGLang's native /generate body: text or input_ids.
func refReadGenerate(req *Request, obj *fastjson.Object) error {
	if t := obj.Get("text"); t != nil && t.Type() != fastjson.TypeNull {
		return refReadPrompt(&req.Prompt, t, "text")
	}
	if ids := obj.Get("input_ids"); ids != nil && ids.Type() != fastjson.TypeNull {
		return refReadPrompt(&req.Prompt, ids, "input_ids")
	}
	return BadRequest("one of 'text' or 'input_ids' is required", "text")
}

// refHash64 is FNV-1a over b: stable across processes and platforms.
func refHash64(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

func refShorten(s string) string {
	const limit = 200
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}
