package oai

import (
	"encoding/json"
	"net/http"
)

// Error is an error the proxy answers itself, rendered as an OpenAI-style
// JSON body: {"error":{"message":...,"type":...,"param":...,"code":...}}.
type Error struct {
	Status  int    // HTTP status
	Message string // human-readable, never contains prompt text
	Type    string // OpenAI error type, e.g. invalid_request_error
	Param   string // the offending field, if any
	Code    string // machine-readable code
}

func (e *Error) Error() string { return e.Message }

// BadRequest is a 400 invalid_request_error about param.
func BadRequest(msg, param string) *Error {
	return &Error{Status: http.StatusBadRequest, Message: msg, Type: "invalid_request_error", Param: param, Code: "invalid_request"}
}

// NewError builds an error with the given status, type and code.
func NewError(status int, typ, code, msg string) *Error {
	return &Error{Status: status, Message: msg, Type: typ, Code: code}
}

type errorBody struct {
	Error errorFields `json:"error"`
}

type errorFields struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// Body renders the error as OpenAI-style JSON.
func (e *Error) Body() []byte {
	f := errorFields{Message: e.Message, Type: e.Type, Code: e.Code}
	if e.Param != "" {
		p := e.Param
		f.Param = &p
	}
	b, _ := json.Marshal(errorBody{Error: f}) // cannot fail: only strings
	return b
}
