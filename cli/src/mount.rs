//! UFS mounts and load jobs: mount, umount, load, load-status and
//! cancel-load.

use curvine_client::Client;
use curvine_messages::path::normalize;
use curvine_messages::FsError;

use crate::args::MountArgs;
use crate::ctx::Ctx;
use crate::output::{job_json, job_line, mount_json, mount_line, print_json, print_list};
use crate::{fail, Failure};

pub async fn mount(
    cx: &Ctx<'_>,
    args: MountArgs,
    props: std::collections::BTreeMap<String, String>,
) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let (Some(ufs), Some(path)) = (args.ufs, args.path) else {
        if !props.is_empty() {
            return Err(fail(
                "mount",
                "",
                FsError::InvalidArgument("properties (-c) need a UFS location and a path".into()),
            ));
        }
        let mounts = client
            .call(curvine_messages::rpc::ListMounts)
            .await
            .map_err(|e| fail("mount", "", e))?;
        print_list(&mounts, json_out, mount_json, mount_line);
        return Ok(());
    };
    let path = normalize(&path, "/").map_err(|e| fail("mount", &path, e))?;
    let bad = |what: &str, e: String| {
        fail(
            "mount",
            &path,
            FsError::InvalidArgument(format!("{what}: {e}")),
        )
    };
    let dur = |flag: &str, v: &Option<String>| -> Result<Option<u64>, Failure> {
        v.as_deref()
            .map(|t| {
                curvine_conf::Dur::parse(t)
                    .map(|d| d.0.as_millis() as u64)
                    .map_err(|e| bad(flag, e))
            })
            .transpose()
    };
    let write_type = curvine_messages::mount::WriteType::parse(&args.write_type)
        .map_err(|e| fail("mount", &path, e))?;
    let block_size = args
        .block_size
        .as_deref()
        .map(|t| {
            curvine_conf::ByteSize::parse(t)
                .map(|b| b.0)
                .map_err(|e| bad("--block-size", e))
        })
        .transpose()?;
    let storage = args
        .storage_type
        .as_deref()
        .map(curvine_messages::block::TierKind::parse)
        .transpose()
        .map_err(|e| fail("mount", &path, e))?;
    let (uid, gid) = curvine_client::client::current_owner();
    let request = curvine_messages::rpc::Mount {
        info: curvine_messages::mount::MountInfo {
            id: 0,
            path: path.clone(),
            ufs: ufs.clone(),
            write_type,
            props,
            ttl_ms: dur("--ttl", &args.ttl)?.unwrap_or(0),
            check_interval_ms: dur("--check-interval", &args.check_interval)?,
            read_verify_ufs: args.read_verify_ufs,
            auto_cache: !args.no_auto_cache,
            replicas: args.replicas,
            block_size,
            storage,
            created_ns: 0,
        },
        uid,
        gid,
    };
    let m = client
        .call(request)
        .await
        .map_err(|e| fail("mount", &format!("{ufs} {path}"), e))?;
    if json_out {
        print_json(&mount_json(&m));
    } else {
        out!("mounted {}", mount_line(&m));
    }
    Ok(())
}

pub async fn umount(cx: &Ctx<'_>, path: &str) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let path = cx.abs(path)?;
    let m = client
        .call(curvine_messages::rpc::Umount { path: path.clone() })
        .await
        .map_err(|e| fail("umount", &path, e))?;
    if json_out {
        print_json(&mount_json(&m));
    } else {
        out!("unmounted {} from {}", m.ufs, m.path);
    }
    Ok(())
}

pub async fn load(
    cx: &Ctx<'_>,
    path: String,
    wait: bool,
    no_overwrite: bool,
) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let job = client
        .call(curvine_messages::rpc::Load {
            path: path.clone(),
            no_overwrite,
        })
        .await
        .map_err(|e| fail("load", &path, e))?;
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if !wait && !terminal {
        if json_out {
            print_json(&job_json(&job));
        } else {
            out!("load job {} started for {}", job.id, job.path);
        }
        return Ok(());
    }
    if terminal && !json_out {
        eout!(
            "load job {} for {} (Ctrl-C leaves it running; see load-status {})",
            job.id,
            job.path,
            job.id
        );
    }
    let job = follow_job(client, &job.id, terminal && !json_out).await?;
    finish_job(&job, json_out)
}

pub async fn load_status(cx: &Ctx<'_>, id: Option<String>, watch: bool) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    match id {
        None => {
            let jobs = client
                .call(curvine_messages::rpc::ListLoads)
                .await
                .map_err(|e| fail("load-status", "", e))?;
            print_list(&jobs, json_out, job_json, job_line);
        }
        Some(id) => {
            let job = if watch {
                follow_job(client, &id, !json_out).await?
            } else {
                client
                    .call(curvine_messages::rpc::LoadStatus { id: id.clone() })
                    .await
                    .map_err(|e| fail("load-status", &id, e))?
            };
            if json_out {
                print_json(&job_json(&job));
            } else {
                out!("{}", job_line(&job));
                for (path, error) in &job.failures {
                    out!("  failed: {path}: {error}");
                }
            }
        }
    }
    Ok(())
}

pub async fn cancel_load(cx: &Ctx<'_>, id: &str) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let job = client
        .call(curvine_messages::rpc::CancelLoad { id: id.to_string() })
        .await
        .map_err(|e| fail("cancel-load", id, e))?;
    if json_out {
        print_json(&job_json(&job));
    } else {
        out!("{}", job_line(&job));
    }
    Ok(())
}

/// Polls a job until it ends, with a progress bar when `bar` is set.
async fn follow_job(
    client: &Client,
    id: &str,
    bar: bool,
) -> Result<curvine_messages::mount::LoadJob, Failure> {
    let progress = bar.then(|| {
        let p = indicatif::ProgressBar::new(0);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ) {
            p.set_style(style.progress_chars("=> "));
        }
        p
    });
    loop {
        let job = client
            .call(curvine_messages::rpc::LoadStatus { id: id.to_string() })
            .await
            .map_err(|e| fail("load-status", id, e))?;
        if let Some(p) = &progress {
            p.set_length(job.bytes_total.max(1));
            p.set_position(job.bytes_done.min(job.bytes_total));
            p.set_message(format!(
                "{} {}/{} files{}",
                job.state,
                job.files_done + job.files_skipped,
                job.files_total,
                if job.files_failed > 0 {
                    format!(", {} failed", job.files_failed)
                } else {
                    String::new()
                }
            ));
        }
        if job.state.finished() {
            if let Some(p) = &progress {
                p.finish_and_clear();
            }
            return Ok(job);
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}

/// Prints a finished job; a job with failed files (or failed as a whole)
/// is an error.
fn finish_job(job: &curvine_messages::mount::LoadJob, json_out: bool) -> Result<(), Failure> {
    use curvine_messages::mount::JobState;
    if json_out {
        print_json(&job_json(job));
    } else {
        out!("{}", job_line(job));
        for (path, error) in &job.failures {
            out!("  failed: {path}: {error}");
        }
        if job.files_failed as usize > job.failures.len() {
            out!(
                "  ... and {} more failed files",
                job.files_failed as usize - job.failures.len()
            );
        }
    }
    let failure = |error: String| Failure {
        what: format!("load {}", job.path),
        error,
        code: 1,
    };
    match job.state {
        JobState::Done if job.files_failed == 0 => Ok(()),
        JobState::Done => Err(failure(format!(
            "{} of {} files failed",
            job.files_failed, job.files_total
        ))),
        JobState::Cancelled => Err(failure("the job was cancelled".into())),
        _ => Err(failure(job.error.clone())),
    }
}
