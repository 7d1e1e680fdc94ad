//! The mount's actors: a [`supervisor`] owns a `FuseSession`, which owns
//! the fuser session (the kernel connection and its threads).
//!
//! - The session mounts in `pre_start` and unmounts in `post_stop`.
//! - When the kernel ends the session (an unmount from outside), the
//!   session stops normally and the supervisor stops with it: the process
//!   exits cleanly.
//! - When the session fails, the supervisor aborts the kernel connection
//!   and detaches the mount point (so nothing hangs on it), logs what
//!   happened, and mounts again with backoff, up to the restart limit.

use std::path::PathBuf;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use curvine_runtime::stats::Metrics;
use curvine_runtime::supervisor::{ActorChild, RestartPolicy, SupervisorArgs};

use crate::fs::{CurvineFs, Fs};
use crate::mountpoint;

static FATAL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Why the supervisor gave up, if it did.
pub fn fatal() -> Option<String> {
    FATAL.get().cloned()
}

/// Builds the file system state for a new session (a remount starts with
/// an empty inode table, as the kernel does).
pub type FsFactory = Arc<dyn Fn() -> Arc<Fs> + Send + Sync>;

#[derive(Clone)]
pub struct MountSpec {
    pub mountpoint: PathBuf,
    pub options: fuser::Config,
    pub make_fs: FsFactory,
    /// Readahead to ask of the kernel for the mount (bytes).
    pub read_ahead: u64,
}

pub enum SessionMsg {
    /// The fuser session returned (`None`: the kernel ended it normally).
    Ended(Option<String>),
}

impl ractor::Message for SessionMsg {}

pub struct FuseSession;

pub struct SessionState {
    unmounter: Option<fuser::SessionUnmounter>,
    mountpoint: PathBuf,
}

impl Actor for FuseSession {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = MountSpec;

    async fn pre_start(
        &self,
        myself: ActorRef<SessionMsg>,
        spec: MountSpec,
    ) -> Result<SessionState, ActorProcessingErr> {
        let fs = (spec.make_fs)();
        let mnt = spec.mountpoint.clone();
        let options = spec.options.clone();
        let fs2 = fs.clone();
        let mut session = tokio::task::spawn_blocking(move || {
            fuser::Session::new(CurvineFs(fs2), &mnt, &options)
        })
        .await
        .map_err(|e| format!("mount task: {e}"))?
        .map_err(|e| format!("cannot mount on {}: {e}", spec.mountpoint.display()))?;
        let unmounter = session.unmount_callable();
        fs.set_notifier(session.notifier());
        let me = myself.clone();
        std::thread::Builder::new()
            .name("fuse-session".into())
            .spawn(move || {
                let result = session.run();
                let _ = me.cast(SessionMsg::Ended(result.err().map(|e| e.to_string())));
            })
            .map_err(|e| format!("cannot start the session thread: {e}"))?;
        if let Some(ra) = mountpoint::set_read_ahead(&spec.mountpoint, spec.read_ahead) {
            tracing::info!(read_ahead_kb = ra / 1024, "kernel readahead of the mount");
        }
        tracing::info!(mountpoint = %spec.mountpoint.display(), "mounted");
        Ok(SessionState {
            unmounter: Some(unmounter),
            mountpoint: spec.mountpoint,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SessionMsg>,
        message: SessionMsg,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SessionMsg::Ended(None) => {
                tracing::info!(mountpoint = %state.mountpoint.display(), "unmounted");
                state.unmounter = None;
                myself.stop(Some("unmounted".into()));
                Ok(())
            }
            SessionMsg::Ended(Some(e)) => Err(format!("the FUSE session ended: {e}").into()),
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<SessionMsg>,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(mut u) = state.unmounter.take() {
            if let Err(e) = u.unmount() {
                tracing::warn!(error = %e, "unmount failed; detaching the mount");
                if let Err(e) = mountpoint::unmount(&state.mountpoint, true) {
                    tracing::error!(error = %e, "cannot detach the mount");
                }
            }
        }
        Ok(())
    }
}

/// The mount's supervisor (role `fuse`): it runs the `FuseSession`
/// (role `fuse-session`) and mounts again with backoff when the session
/// fails, after clearing the dead mount point so nothing hangs on it; an
/// unmount (the session stopping) ends it; when the session fails too
/// often it gives up, and [`fatal`] says why.
pub fn supervisor(spec: MountSpec, policy: RestartPolicy) -> SupervisorArgs {
    let mnt = spec.mountpoint.clone();
    let session = ActorChild::new("fuse-session", move || (FuseSession, spec.clone()))
        .ending_supervisor()
        .on_stop(move |failure| {
            let Some(error) = failure else {
                tracing::info!("the FUSE session ended");
                return;
            };
            match mountpoint::clear(&mnt) {
                Ok(done) => tracing::error!(
                    error,
                    cleanup = done,
                    "the FUSE session failed; nothing waits on the mount point"
                ),
                Err(e) => tracing::error!(
                    error,
                    cleanup_error = e,
                    "the FUSE session failed and its mount could not be detached"
                ),
            }
        });
    SupervisorArgs::new("fuse", policy, Metrics::new())
        .child(session.boxed())
        .on_give_up(|reason| {
            let _ = FATAL.set(format!("the FUSE session failed: {reason}"));
        })
}
