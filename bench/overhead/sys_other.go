//go:build !linux

package overhead

import (
	"errors"
	"time"
)

func treeCPU(int) (time.Duration, int) { return 0, 0 }

func selfCPU() time.Duration { return 0 }

func allowedCPUs() ([]int, error) { return nil, errors.New("CPU placement needs Linux") }

func pinSelf([]int, int) (func(), error) { return nil, errors.New("CPU placement needs Linux") }
