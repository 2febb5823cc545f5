//go:build !linux

package sockio

import (
	"context"
	"errors"
	"net"
)

// Handler is told by a Poller that its connection has bytes to read.
type Handler interface {
	Ready()
}

// Token names a connection added to a Poller.
type Token struct{}

// Poller needs epoll: NewPoller fails elsewhere, and its callers keep to
// a goroutine per connection.
type Poller struct{}

// NewPoller fails: there is no Poller on this system.
func NewPoller() (*Poller, error) { return nil, errors.New("sockio: no poller on this system") }

// Add fails.
func (*Poller) Add(net.Conn, Handler) (Token, error) { return Token{}, errors.ErrUnsupported }

// Remove does nothing.
func (*Poller) Remove(net.Conn, Token) {}

// Run returns at once.
func (*Poller) Run(context.Context) {}

// Close does nothing.
func (*Poller) Close() {}

var stopped = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done is closed.
func (*Poller) Done() <-chan struct{} { return stopped }
