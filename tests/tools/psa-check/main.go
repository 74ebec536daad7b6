// psa-check evaluates the pods of Kubernetes manifests against a Pod Security Standard level with
// the Pod Security Admission's own checks (k8s.io/pod-security-admission), the code an API server
// runs when a namespace is labelled pod-security.kubernetes.io/enforce=<level>.
//
//	psa-check [-level restricted] FILE...
//
// One line per workload: "<file>: <Kind>/<name>: ok" or one "<file>: <Kind>/<name>: <check>: <reason>: <detail>"
// per violation. Exits 1 when any workload violates the level, 2 on a file it cannot read.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"
)

type workload struct {
	kind, name string
	meta       *metav1.ObjectMeta
	spec       *corev1.PodSpec
}

// podOf returns the pod a manifest runs, or nil for a kind that runs none (Service, ConfigMap...).
func podOf(doc []byte) (*workload, error) {
	var head struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return nil, err
	}
	w := &workload{kind: head.Kind, name: head.Metadata.Name}
	strict := func(into any) error { return yaml.UnmarshalStrict(doc, into) }
	switch head.Kind {
	case "Pod":
		var o corev1.Pod
		if err := strict(&o); err != nil {
			return nil, err
		}
		w.meta, w.spec = &o.ObjectMeta, &o.Spec
	case "Deployment":
		var o appsv1.Deployment
		if err := strict(&o); err != nil {
			return nil, err
		}
		w.meta, w.spec = &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case "StatefulSet":
		var o appsv1.StatefulSet
		if err := strict(&o); err != nil {
			return nil, err
		}
		w.meta, w.spec = &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case "DaemonSet":
		var o appsv1.DaemonSet
		if err := strict(&o); err != nil {
			return nil, err
		}
		w.meta, w.spec = &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case "ReplicaSet":
		var o appsv1.ReplicaSet
		if err := strict(&o); err != nil {
			return nil, err
		}
		w.meta, w.spec = &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case "Job":
		var o batchv1.Job
		if err := strict(&o); err != nil {
			return nil, err
		}
		w.meta, w.spec = &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case "CronJob":
		var o batchv1.CronJob
		if err := strict(&o); err != nil {
			return nil, err
		}
		w.meta, w.spec = &o.Spec.JobTemplate.Spec.Template.ObjectMeta, &o.Spec.JobTemplate.Spec.Template.Spec
	default:
		return nil, nil
	}
	return w, nil
}

func check(evaluator policy.Evaluator, level api.LevelVersion, path string, out io.Writer) (violations int, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return violations, nil
		}
		if err != nil {
			return violations, fmt.Errorf("%s: %w", path, err)
		}
		w, err := podOf(doc)
		if err != nil {
			return violations, fmt.Errorf("%s: %w", path, err)
		}
		if w == nil {
			continue
		}
		failed := 0
		for _, result := range evaluator.EvaluatePod(level, w.meta, w.spec) {
			if !result.Allowed {
				failed++
				fmt.Fprintf(out, "%s: %s/%s: %s: %s\n", path, w.kind, w.name, result.ForbiddenReason, result.ForbiddenDetail)
			}
		}
		if failed == 0 {
			fmt.Fprintf(out, "%s: %s/%s: ok\n", path, w.kind, w.name)
		}
		violations += failed
	}
}

func main() {
	levelName := flag.String("level", string(api.LevelRestricted), "the Pod Security Standard: privileged, baseline or restricted")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: psa-check [-level restricted] FILE...")
		os.Exit(2)
	}
	level, err := api.ParseLevel(*levelName)
	if err != nil {
		fmt.Fprintln(os.Stderr, "psa-check:", err)
		os.Exit(2)
	}
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "psa-check:", err)
		os.Exit(2)
	}
	levelVersion := api.LevelVersion{Level: level, Version: api.LatestVersion()}
	violations := 0
	for _, path := range flag.Args() {
		n, err := check(evaluator, levelVersion, path, os.Stdout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "psa-check:", err)
			os.Exit(2)
		}
		violations += n
	}
	if violations > 0 {
		os.Exit(1)
	}
}
