package sim

import "errors"

// newZMQSink binds the replica's event publisher.
func newZMQSink(c *Config) (batchSink, error) {
	return nil, errors.New("sim: KV events need package kvevents")
}
