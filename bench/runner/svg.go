package runner

import (
	"fmt"
	"math"
	"strings"
)

// palette colours routers in report order (Tableau 10).
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// Chart geometry, in SVG user units (pixels).
const (
	svgW, svgH = 1000, 520
	// TTFT CDF panel.
	cdfX0, cdfX1, cdfY0, cdfY1 = 70.0, 570.0, 80.0, 450.0
	// Bar panels: labels end at barLabelX, bars span barX0..barX1.
	barLabelX, barX0, barX1 = 770.0, 778.0, 940.0
	hitY0, hitY1            = 80.0, 250.0
	p90Y0, p90Y1            = 300.0, 470.0
)

// SVG renders the report as a standalone SVG chart: the TTFT CDF of every
// router (log time axis) on the left, and on the right a bar panel of the
// replica-counted hit rate (with the ideal rate marked) and one of TTFT p90.
func (r *Report) SVG() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="11">`+"\n", svgW, svgH, svgW, svgH)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w(`<text x="%d" y="24" font-size="15" font-weight="bold">kvroute bench: %s</text>`+"\n", int(cdfX0), esc(r.Workload))
	hitTitle, hit := "prefix-cache hit rate (replica counters)", func(res *RouterResult) float64 { return res.HitRate }
	if r.Target != "" {
		w(`<text x="%d" y="44" fill="#444">%d requests against %s, real time, rate scale %g; ideal hit rate %s; times in measured seconds</text>`+"\n",
			int(cdfX0), r.Requests, esc(r.Target), r.RateScale, pct(r.IdealHitRate))
		hitTitle, hit = "prefix-cache hit rate (reported in usage)", func(res *RouterResult) float64 { return res.Summary.ReportedHitRate }
	} else {
		w(`<text x="%d" y="44" fill="#444">%d requests, %d × %s replicas per router, time scale %g, rate scale %g; ideal hit rate %s; times in simulated seconds</text>`+"\n",
			int(cdfX0), r.Requests, r.Replicas, esc(r.Preset), r.TimeScale, r.RateScale, pct(r.IdealHitRate))
	}
	r.svgCDF(w)
	r.svgBars(w, hitY0, hitY1, hitTitle, 1, r.IdealHitRate, hit, pct)
	maxP90 := 0.0
	for i := range r.Results {
		maxP90 = max(maxP90, r.Results[i].Summary.TTFT.P90)
	}
	r.svgBars(w, p90Y0, p90Y1, "TTFT p90", niceCeil(maxP90), -1,
		func(res *RouterResult) float64 { return res.Summary.TTFT.P90 }, secs)
	w("</svg>\n")
	return b.String()
}

// svgCDF draws the TTFT CDF panel with its legend.
func (r *Report) svgCDF(w func(string, ...any)) {
	w(`<text x="%g" y="%g" font-size="13" font-weight="bold">TTFT CDF</text>`+"\n", cdfX0, cdfY0-12)
	lo, hi := math.Inf(1), 0.0
	for i := range r.Results {
		for _, p := range r.Results[i].TTFTCDF {
			if p[0] > 0 {
				lo, hi = min(lo, p[0]), max(hi, p[0])
			}
		}
	}
	w(`<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#999"/>`+"\n", cdfX0, cdfY0, cdfX1-cdfX0, cdfY1-cdfY0)
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 1} {
		y := cdfY1 - f*(cdfY1-cdfY0)
		w(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#e5e5e5"/>`+"\n", cdfX0, y, cdfX1, y)
		w(`<text x="%g" y="%.1f" text-anchor="end" dominant-baseline="middle">%.0f%%</text>`+"\n", cdfX0-6, y, 100*f)
	}
	w(`<text transform="translate(%g,%g) rotate(-90)" text-anchor="middle">fraction of requests</text>`+"\n", cdfX0-46, (cdfY0+cdfY1)/2)
	w(`<text x="%g" y="%g" text-anchor="middle">time to first token (s, log scale)</text>`+"\n", (cdfX0+cdfX1)/2, cdfY1+34)
	if hi == 0 {
		w(`<text x="%g" y="%g" text-anchor="middle" fill="#999">no successful request</text>`+"\n", (cdfX0+cdfX1)/2, (cdfY0+cdfY1)/2)
		return
	}
	// The axis runs between 1-2-5 values around the data.
	a0, a1 := niceFloor(lo), niceCeil(hi)
	if a1 <= a0 {
		a1 = niceCeil(a0 * 1.01)
	}
	l0, l1 := math.Log10(a0), math.Log10(a1)
	x := func(s float64) float64 {
		s = min(max(s, a0), a1)
		return cdfX0 + (math.Log10(s)-l0)/(l1-l0)*(cdfX1-cdfX0)
	}
	labelAll := l1-l0 <= 3.01
	for d := math.Floor(l0); d <= math.Ceil(l1); d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if v < a0*0.999 || v > a1*1.001 {
				continue
			}
			xv := x(v)
			stroke := "#f0f0f0"
			if m == 1 {
				stroke = "#e0e0e0"
			}
			w(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="%s"/>`+"\n", xv, cdfY0, xv, cdfY1, stroke)
			if m == 1 || labelAll {
				w(`<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", xv, cdfY1+16, tickLabel(v))
			}
		}
	}
	y := func(f float64) float64 { return cdfY1 - f*(cdfY1-cdfY0) }
	legend := 0
	for i := range r.Results {
		res := &r.Results[i]
		if len(res.TTFTCDF) == 0 {
			continue
		}
		var pts strings.Builder
		prevQ := 0.0
		for _, p := range res.TTFTCDF {
			// A step function: up at each measured TTFT.
			fmt.Fprintf(&pts, "%.1f,%.1f %.1f,%.1f ", x(p[0]), y(prevQ), x(p[0]), y(p[1]))
			prevQ = p[1]
		}
		w(`<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color(i), strings.TrimSpace(pts.String()))
		legend++
	}
	// Legend in the lower right, where CDFs rarely go.
	lx, ly := cdfX1-190, cdfY1-10-18*float64(legend)
	w(`<rect x="%g" y="%g" width="182" height="%g" fill="white" fill-opacity="0.85" stroke="#ccc"/>`+"\n", lx, ly-4, 18*float64(legend)+6)
	k := 0
	for i := range r.Results {
		if len(r.Results[i].TTFTCDF) == 0 {
			continue
		}
		yy := ly + 18*float64(k) + 8
		w(`<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="3"/>`+"\n", lx+8, yy, lx+30, yy, color(i))
		w(`<text x="%g" y="%g" dominant-baseline="middle">%s</text>`+"\n", lx+36, yy, esc(r.Results[i].Router))
		k++
	}
}

// svgBars draws a horizontal bar panel between y0 and y1 with one bar per
// router, scaled to full; mark (when ≥ 0) draws a dashed "ideal" line.
func (r *Report) svgBars(w func(string, ...any), y0, y1 float64, title string, full, mark float64,
	value func(*RouterResult) float64, label func(float64) string) {
	w(`<text x="%g" y="%g" font-size="13" font-weight="bold">%s</text>`+"\n", barLabelX-140, y0-12, esc(title))
	n := len(r.Results)
	if n == 0 {
		return
	}
	if full <= 0 {
		full = 1
	}
	slot := (y1 - y0) / float64(n)
	h := min(22, slot-4)
	w(`<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#999"/>`+"\n", barX0, y0, barX0, y1)
	for i := range r.Results {
		res := &r.Results[i]
		yc := y0 + slot*(float64(i)+0.5)
		w(`<text x="%g" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", barLabelX, yc, esc(res.Router))
		if res.Error != "" && res.Summary.OK == 0 {
			w(`<text x="%g" y="%.1f" dominant-baseline="middle" fill="#c00">failed</text>`+"\n", barX0+4, yc)
			continue
		}
		v := value(res)
		bw := max(v/full*(barX1-barX0), 0)
		w(`<rect x="%g" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", barX0, yc-h/2, bw, h, color(i))
		w(`<text x="%.1f" y="%.1f" dominant-baseline="middle">%s</text>`+"\n", barX0+bw+4, yc, label(v))
	}
	if mark >= 0 {
		xm := barX0 + mark/full*(barX1-barX0)
		w(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#333" stroke-dasharray="4 3"/>`+"\n", xm, y0-4, xm, y1)
		w(`<text x="%.1f" y="%g" text-anchor="middle" fill="#333">ideal %s</text>`+"\n", xm, y1+14, pct(mark))
	}
}

// color is router i's colour.
func color(i int) string { return palette[i%len(palette)] }

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// niceFloor rounds v > 0 down to 1, 2 or 5 times a power of ten.
func niceFloor(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{5, 2, 1} {
		if m*p <= v {
			return m * p
		}
	}
	return p
}

// tickLabel formats a log-axis tick value in seconds.
func tickLabel(v float64) string {
	if v >= 1 {
		return fmt.Sprintf("%g", math.Round(v))
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.4f", v), "0"), ".")
}

// esc escapes text for SVG.
func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
