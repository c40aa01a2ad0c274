#pragma once

// `cohort submit --k8s`: the job as a Kubernetes indexed Job, one pod per
// rank, with a headless Service so every pod reaches rank 0's store at
// `<name>-0.<name>`. Written for a user to apply (`kubectl apply -f`); not
// tested against a cluster here (docs/slurm.md, "Kubernetes").

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cohort::cluster {

struct K8sRequest {
  std::string name;        // a DNS label: the Job's and the Service's name
  std::string image;       // a container image holding the cohort binary
  int64_t ranks = 1;       // pods
  int64_t cpusPerRank = 0;  // 0: no request
  int64_t gpusPerRank = 0;
  int64_t masterPort = 29500;
  int64_t backoffLimit = 3;  // distribution.max_restarts
  std::string runDir;        // on a volume every pod mounts at the same path
  std::string storeTokenSecret;  // a Secret with key `token`
  // Variables every rank gets (--debug: launch::debugEnvironment).
  std::vector<std::pair<std::string, std::string>> env;
};

std::string k8sManifest(const K8sRequest& request);

// `name` made a DNS-1123 label: lower case, [a-z0-9-], at most 50 characters.
std::string dnsLabel(const std::string& name);

}  // namespace cohort::cluster
