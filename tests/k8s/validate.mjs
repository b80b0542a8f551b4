// Validates Prometheus Operator and KEDA objects against the CRD schemas bundled in
// @kubernetes-models/prometheus-operator and @kubernetes-models/keda. Input: a JSON array of objects on stdin (the
// rendered kustomization, from tests/test_deploy.py). Output: one line per object,
// "ok KIND/NAME" or "FAIL KIND/NAME: reason"; exit status 1 if any failed.
import { readFileSync } from "node:fs";
import {
  PodMonitor,
  PrometheusRule,
  ServiceMonitor,
} from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1";

const MODELS = {
  "monitoring.coreos.com/v1": { PodMonitor, PrometheusRule, ServiceMonitor },
  "keda.sh/v1alpha1": { ScaledObject },
};

let failed = false;
for (const doc of JSON.parse(readFileSync(0, "utf8"))) {
  const where = `${doc.kind}/${doc.metadata?.name}`;
  const Model = MODELS[doc.apiVersion]?.[doc.kind];
  if (!Model) {
    console.log(`FAIL ${where}: not a ${doc.apiVersion} kind this script knows`);
    failed = true;
    continue;
  }
  try {
    new Model(doc).validate();
    console.log(`ok ${where}`);
  } catch (err) {
    console.log(`FAIL ${where}: ${String(err.message ?? err).replaceAll("\n", " ")}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
