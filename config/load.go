package config

import (
	"fmt"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// EnvPrefix prefixes environment overrides: KVROUTE_LISTEN,
// KVROUTE_TIMEOUTS_FIRST_BYTE, and so on (dots become underscores).
const EnvPrefix = "KVROUTE"

// FlagKeys maps command-line flag names to the configuration keys they override.
var FlagKeys = map[string]string{
	"listen":       "listen",
	"admin-listen": "admin_listen",
	"policy":       "policy",
	"log-level":    "log.level",
	"log-format":   "log.format",
}

// Default returns the configuration with every default applied and no
// backends; callers building a configuration in code start from it.
func Default() *Config {
	v := viper.New()
	for k, d := range Defaults() {
		v.SetDefault(k, d)
	}
	var c Config
	if err := decode(v, &c); err != nil {
		panic("config: defaults do not decode: " + err.Error()) // a programming error
	}
	return &c
}

func decode(v *viper.Viper, c *Config) error {
	return v.UnmarshalExact(c, func(dc *mapstructure.DecoderConfig) {
		dc.ErrorUnused = true
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		)
	})
}

// Load reads path (if not empty), then KVROUTE_* environment variables, then
// the flags in fs that were set, decodes strictly (an unknown key is an error)
// and validates.
func Load(path string, fs *pflag.FlagSet) (*Config, error) {
	v := viper.New()
	for k, d := range Defaults() {
		v.SetDefault(k, d)
	}
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	if fs != nil {
		for flag, key := range FlagKeys {
			if f := fs.Lookup(flag); f != nil {
				if err := v.BindPFlag(key, f); err != nil {
					return nil, fmt.Errorf("flag --%s: %w", flag, err)
				}
			}
		}
	}
	if path != "" {
		v.SetConfigFile(path)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
	}
	var c Config
	if err := decode(v, &c); err != nil {
		return nil, fmt.Errorf("decoding configuration: %w", err)
	}
	for i := range c.Backends {
		if c.Backends[i].Engine == "" {
			c.Backends[i].Engine = "vllm"
		}
		if c.Backends[i].Weight == 0 {
			c.Backends[i].Weight = 1
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}
