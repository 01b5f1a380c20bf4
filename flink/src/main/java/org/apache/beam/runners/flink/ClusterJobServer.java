package org.apache.beam.runners.flink;

// In Beam's package: the job server configuration's getters are package-private.

import java.util.Collections;
import java.util.List;
import java.util.UUID;
import org.apache.beam.model.pipeline.v1.RunnerApi;
import org.apache.beam.runners.jobsubmission.JobInvocation;
import org.apache.beam.sdk.io.FileSystems;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.PortablePipelineOptions;
import org.apache.beam.sdk.util.construction.PipelineOptionsTranslation;
import org.apache.beam.vendor.grpc.v1p60p1.com.google.protobuf.Struct;
import org.apache.beam.vendor.guava.v32_1_2_jre.com.google.common.util.concurrent.ListeningExecutorService;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Beam's Flink job server, shipping no jars with a job.
 *
 * <p>Beam's own job server stages its whole classpath with every job it submits to a running
 * cluster: the 162 jars (152 MB) of the runner and its dependencies, uploaded to the
 * JobManager each time, which took most of a job's start. A cluster whose {@code lib/} already
 * holds those jars (as the one {@code tests/} starts does, and as Beam's deployment notes
 * suggest) needs none of them: this driver submits the job graph alone. Everything else is
 * Beam's {@link FlinkJobServerDriver}, with the same flags.
 *
 * <p>Set the environment variable {@code BEAM_FLINK_STAGE_CLASSPATH=1} for a cluster without
 * the jars: jobs then stage the classpath as Beam's driver does.
 */
public final class ClusterJobServer {
  private static final Logger LOG = LoggerFactory.getLogger(ClusterJobServer.class);

  private ClusterJobServer() {}

  public static void main(String[] args) throws Exception {
    FileSystems.setDefaultPipelineOptions(PipelineOptionsFactory.create());
    if ("1".equals(System.getenv("BEAM_FLINK_STAGE_CLASSPATH"))) {
      FlinkJobServerDriver.fromParams(args).run();
      return;
    }
    FlinkJobServerDriver.FlinkServerConfiguration config = FlinkJobServerDriver.parseArgs(args);
    FlinkJobServerDriver.fromConfig(config, () -> new Invoker(config)).run();
  }

  /** {@link FlinkJobInvoker}, with an empty list of files to stage. */
  private static final class Invoker extends FlinkJobInvoker {
    private final FlinkJobServerDriver.FlinkServerConfiguration config;

    Invoker(FlinkJobServerDriver.FlinkServerConfiguration config) {
      super(config);
      this.config = config;
    }

    @Override
    protected JobInvocation invokeWithExecutor(
        RunnerApi.Pipeline pipeline,
        Struct options,
        String retrievalToken,
        ListeningExecutorService executor) {
      FlinkPipelineOptions flinkOptions =
          PipelineOptionsTranslation.fromProto(options).as(FlinkPipelineOptions.class);
      String jar = flinkOptions.as(PortablePipelineOptions.class).getOutputExecutablePath();
      if (jar != null && !jar.isEmpty()) {
        // Writing a self-contained job jar: Beam's way, which packs the classpath.
        return super.invokeWithExecutor(pipeline, options, retrievalToken, executor);
      }
      String invocationId = String.format("%s_%s", flinkOptions.getJobName(), UUID.randomUUID());
      if ("[auto]".equals(flinkOptions.getFlinkMaster())) {
        flinkOptions.setFlinkMaster(config.getFlinkMaster());
      }
      List<String> staged = Collections.emptyList();
      FlinkPipelineRunner runner =
          new FlinkPipelineRunner(flinkOptions, config.getFlinkConfDir(), staged);
      flinkOptions.setRunner(null);
      LOG.info("Invoking job {}, staging no jars (the cluster holds the runner's)", invocationId);
      return createJobInvocation(
          invocationId, retrievalToken, executor, pipeline, flinkOptions, runner);
    }
  }
}
