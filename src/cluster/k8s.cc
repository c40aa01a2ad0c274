#include "cohort/cluster/k8s.h"

#include <fmt/format.h>

#include <cctype>

namespace cohort::cluster {

std::string dnsLabel(const std::string& name) {
  std::string out;
  for (const char c : name) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out += std::isalnum(static_cast<unsigned char>(l)) ? l : '-';
  }
  while (!out.empty() && out.front() == '-') out.erase(out.begin());
  if (out.size() > 50) out.resize(50);
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "cohort" : out;
}

std::string k8sManifest(const K8sRequest& r) {
  const std::string name = dnsLabel(r.name);
  std::string resources, env;
  for (const auto& [n, v] : r.env) env += fmt::format("            - name: {}\n              value: \"{}\"\n", n, v);
  if (r.cpusPerRank > 0 || r.gpusPerRank > 0) {
    resources = "          resources:\n            limits:\n";
    if (r.cpusPerRank > 0) resources += fmt::format("              cpu: \"{}\"\n", r.cpusPerRank);
    if (r.gpusPerRank > 0) resources += fmt::format("              nvidia.com/gpu: \"{}\"\n", r.gpusPerRank);
  }
  return fmt::format(
      R"(# Written by `cohort submit --k8s`: one pod per rank, as an indexed Job.
# Needs: an image holding cohort, the run directory on a volume every pod
# mounts at the same path, and a Secret '{secret}' with key 'token' (the
# store token: kubectl create secret generic {secret} --from-literal=token=$(openssl rand -hex 32)).
# Not tested against a cluster by cohort's tests.
apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  clusterIP: None  # headless: {name}-0.{name} is rank 0's pod
  selector:
    job-name: {name}
  ports:
    - name: store
      port: {port}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
spec:
  completionMode: Indexed
  completions: {ranks}
  parallelism: {ranks}
  backoffLimit: {backoff}
  template:
    spec:
      subdomain: {name}
      restartPolicy: Never
      terminationGracePeriodSeconds: 120  # SIGTERM: checkpoint, then exit 75
      containers:
        - name: rank
          image: {image}
          command: ["cohort", "worker", "{run}/job.yaml", "--run-dir", "{run}"]
          env:
            - name: RANK
              valueFrom:
                fieldRef:
                  fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
            - name: WORLD_SIZE
              value: "{ranks}"
            - name: LOCAL_RANK
              value: "0"
            - name: LOCAL_WORLD_SIZE
              value: "1"
            - name: MASTER_ADDR
              value: {name}-0.{name}
            - name: MASTER_PORT
              value: "{port}"
            - name: COHORT_STORE_TOKEN
              valueFrom:
                secretKeyRef:
                  name: {secret}
                  key: token
{env}{resources}          volumeMounts:
            - name: runs
              mountPath: {run}
      volumes:
        - name: runs
          persistentVolumeClaim:
            claimName: {name}-runs  # ReadWriteMany: every pod writes the same run directory
)",
      fmt::arg("name", name), fmt::arg("secret", r.storeTokenSecret.empty() ? name + "-store-token" : r.storeTokenSecret),
      fmt::arg("port", r.masterPort), fmt::arg("ranks", r.ranks), fmt::arg("backoff", r.backoffLimit),
      fmt::arg("image", r.image.empty() ? "cohort:latest" : r.image), fmt::arg("run", r.runDir),
      fmt::arg("resources", resources), fmt::arg("env", env));
}

}  // namespace cohort::cluster
