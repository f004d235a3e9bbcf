// Command parse-quantity is the reference tessera's quantity parser is tested against: it
// reads one Kubernetes quantity per line on stdin and prints, per line, what
// k8s.io/apimachinery's resource.ParseQuantity (the parser of the API server and of CEL's
// quantity()) makes of it:
//
//	ok <unscaled> <scale> <Value()> <String()>   value = unscaled * 10^-scale
//	error <message>
//
// Value() and String() are left out ("-") when the exponent is far out of any real range,
// where they would build enormous numbers.
package main

import (
	"bufio"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/api/resource"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		q, err := resource.ParseQuantity(in.Text())
		if err != nil {
			fmt.Fprintf(out, "error %v\n", err)
			continue
		}
		d := q.AsDec()
		value, canonical := "-", "-"
		if s := d.Scale(); s > -1000 && s < 1000 {
			value, canonical = fmt.Sprint(q.Value()), q.String()
		}
		fmt.Fprintf(out, "ok %s %d %s %s\n", d.UnscaledBig().String(), d.Scale(), value,
			canonical)
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "parse-quantity: %v\n", err)
		os.Exit(1)
	}
}
