// The single-node admin APIs through Java's Admin client: describeLogDirs, alterReplicaLogDirs, electLeaders,
// alterPartitionReassignments, listPartitionReassignments, describeMetadataQuorum, describeFeatures,
// updateFeatures and listConfigResources. Prints one key=value line per observation; an exception is printed
// as its class's simple name. Arguments: bootstrap, topic name.

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.FeatureMetadata;
import org.apache.kafka.clients.admin.FeatureUpdate;
import org.apache.kafka.clients.admin.ListConfigResourcesOptions;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.QuorumInfo;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.clients.admin.UpdateFeaturesOptions;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionReplica;
import org.apache.kafka.common.config.ConfigResource;

public final class SingleNodeAdmin {
    private SingleNodeAdmin() {}

    private static void print(String key, Object value) {
        System.out.println(key + "=" + value);
    }

    /** "ok", or the simple name of the exception the future failed with. */
    private static String outcome(KafkaFuture<?> future) throws InterruptedException {
        try {
            future.get();
            return "ok";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getSimpleName();
        }
    }

    private static String finalizedTransactionVersion(Admin admin) throws Exception {
        FeatureMetadata features = admin.describeFeatures().featureMetadata().get();
        var range = features.finalizedFeatures().get("transaction.version");
        return (range == null ? "none" : Short.toString(range.maxVersionLevel()))
            + " epoch " + features.finalizedFeaturesEpoch().orElse(-1L);
    }

    public static void main(String[] args) throws Exception {
        String topic = args[1];
        Properties settings = new Properties();
        settings.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(settings)) {
            admin.createTopics(List.of(new NewTopic(topic, 2, (short) 1))).all().get();
            int node = admin.describeCluster().nodes().get().iterator().next().id();
            TopicPartition first = new TopicPartition(topic, 0);

            Map<String, LogDirDescription> dirs = admin.describeLogDirs(List.of(node)).allDescriptions().get().get(node);
            print("log_dirs", dirs.size());
            String logDir = dirs.keySet().iterator().next();
            LogDirDescription described = dirs.get(logDir);
            print("log_dir", logDir);
            print("log_dir_error", described.error());
            ReplicaInfo replica = described.replicaInfos().get(first);
            print("replica", replica.size() + " lag " + replica.offsetLag() + " future " + replica.isFuture());
            print("volume", described.totalBytes().isPresent() && described.usableBytes().isPresent());

            print("move_same_dir", outcome(admin.alterReplicaLogDirs(
                Map.of(new TopicPartitionReplica(topic, 0, node), logDir)).all()));
            print("move_elsewhere", outcome(admin.alterReplicaLogDirs(
                Map.of(new TopicPartitionReplica(topic, 0, node), logDir + "-elsewhere")).all()));

            for (ElectionType type : ElectionType.values()) {
                Map<TopicPartition, Optional<Throwable>> elected =
                    admin.electLeaders(type, Set.of(first)).partitions().get();
                print("elect_" + type, elected.get(first).map(e -> e.getClass().getSimpleName()).orElse("ok"));
            }
            print("elect_all", admin.electLeaders(ElectionType.PREFERRED, null).partitions().get().size());

            print("reassign_same", outcome(admin.alterPartitionReassignments(
                Map.of(first, Optional.of(new NewPartitionReassignment(List.of(node))))).all()));
            print("reassign_other", outcome(admin.alterPartitionReassignments(
                Map.of(first, Optional.of(new NewPartitionReassignment(List.of(node + 100))))).all()));
            print("reassign_cancel", outcome(admin.alterPartitionReassignments(
                Map.of(first, Optional.<NewPartitionReassignment>empty())).all()));
            print("reassignments", admin.listPartitionReassignments().reassignments().get().size());

            QuorumInfo quorum = admin.describeMetadataQuorum().quorumInfo().get();
            List<String> voters = new ArrayList<>();
            for (QuorumInfo.ReplicaState voter : quorum.voters()) {
                voters.add(voter.replicaId() + "@" + voter.logEndOffset());
            }
            print("quorum", "leader " + quorum.leaderId() + " epoch " + quorum.leaderEpoch()
                + " hw " + quorum.highWatermark() + " voters " + voters + " observers " + quorum.observers().size()
                + " nodes " + new TreeSet<>(quorum.nodes().keySet()));

            print("features_before", finalizedTransactionVersion(admin));
            UpdateFeaturesOptions validateOnly = new UpdateFeaturesOptions().validateOnly(true);
            print("update_unknown", outcome(admin.updateFeatures(Map.of("nope.version",
                new FeatureUpdate((short) 1, FeatureUpdate.UpgradeType.UPGRADE)), validateOnly).all()));
            print("update_validate", outcome(admin.updateFeatures(Map.of("transaction.version",
                new FeatureUpdate((short) 1, FeatureUpdate.UpgradeType.SAFE_DOWNGRADE)), validateOnly).all()));
            print("features_validated", finalizedTransactionVersion(admin));
            print("downgrade", outcome(admin.updateFeatures(Map.of("transaction.version",
                new FeatureUpdate((short) 1, FeatureUpdate.UpgradeType.SAFE_DOWNGRADE)),
                new UpdateFeaturesOptions()).all()));
            print("features_downgraded", finalizedTransactionVersion(admin));
            print("upgrade", outcome(admin.updateFeatures(Map.of("transaction.version",
                new FeatureUpdate((short) 2, FeatureUpdate.UpgradeType.UPGRADE)), new UpdateFeaturesOptions()).all()));
            print("features_upgraded", finalizedTransactionVersion(admin));

            Collection<ConfigResource> resources = admin.listConfigResources(
                Set.of(ConfigResource.Type.TOPIC, ConfigResource.Type.BROKER), new ListConfigResourcesOptions()).all().get();
            Set<String> listed = new TreeSet<>();
            for (ConfigResource resource : resources) {
                listed.add(resource.type() + ":" + resource.name());
            }
            print("config_resources", listed);
        }
    }
}
